//! Workers through toolfs are built by the real nsd: a `shell` command sees only the
//! shell tool's roots — not the caller's view, not the host — runs as nsd's worker uid with only
//! `lo`; and with nsd down, or refusing, the call is denied: toolfs never starts a worker itself.

mod common;
mod tools_support;

use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

use common::*;
use tools_support::{pids_with_arg, unique_sleep, wait_no_process_with_arg};
use warren_test_support::wire::frame_as_nobody;
use warren_toolfs::Status;

/// A granted shell connection whose one root, seen by the tool at `/work`, is a fresh dir with
/// `notes.md` in it; a sibling dir of the root holds `elsewhere.txt`.
async fn shell_on_work(
    d: &Daemon,
    writable: bool,
) -> (warren_9p::Client, warren_9p::Fid, std::path::PathBuf) {
    let (dir, fd) = tool_root(d, "work");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::write(dir.join("notes.md"), "inside the root\n").unwrap();
    std::fs::set_permissions(dir.join("notes.md"), std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::write(d.dir.path().join("elsewhere.txt"), "outside\n").unwrap();
    let mut record = record_with_root(&["shell"], "/work");
    record.tools[0].roots[0].writable = writable;
    let (c, root) = d.granted(&record, &[fd.as_fd()]).await;
    (c, root, dir)
}

async fn shell(root: &warren_9p::Fid, command: &str) -> warren_toolfs::Envelope {
    let args = serde_json::json!({ "command": command }).to_string();
    call_envelope(root, "shell", args.as_bytes()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shell_command_sees_only_the_shell_tools_roots() {
    let d = Daemon::start();
    let (_c, root, dir) = shell_on_work(&d, true).await;

    // Its root, at the path the grant names.
    let env = shell(&root, "cat /work/notes.md").await;
    assert_eq!(env.status, Status::Ok, "{}", env.content);
    assert!(env.content.contains("inside the root"), "{}", env.content);

    // Its whole filesystem: the root, the system dirs a shell execs from, and its own
    // /dev, /proc, /tmp, home and /etc — nothing of the host or of the caller.
    let env = shell(&root, "ls -a /").await;
    assert_eq!(env.status, Status::Ok, "{}", env.content);
    let mut top: Vec<&str> = env
        .content
        .lines()
        .filter(|l| !l.starts_with('[') && *l != "." && *l != "..")
        .collect();
    top.sort_unstable();
    assert_eq!(
        top,
        [
            "bin",
            "dev",
            "etc",
            "home",
            "lib",
            "lib64",
            "proc",
            "tmp",
            "usr",
            "warren-tool-worker",
            "work"
        ],
        "{}",
        env.content
    );
    let env = shell(&root, "ls /etc; ls /home").await;
    assert!(
        !env.content.contains("shadow") && env.content.contains("passwd"),
        "{}",
        env.content
    );
    // The host's secrets, warren's runtime dir, the toolfs socket, the test's own dir: absent.
    let runtime = d.dir.path().join("run");
    let probes = [
        "/etc/shadow".to_string(),
        "/tool".into(),
        "/root".into(),
        "/var".into(),
        "/run".into(),
        runtime.display().to_string(),
        d.dir.path().join("elsewhere.txt").display().to_string(),
        dir.display().to_string(),
    ];
    for path in probes {
        let env = shell(
            &root,
            &format!("test -e '{path}' && echo PRESENT || echo absent"),
        )
        .await;
        assert!(
            env.content.starts_with("absent"),
            "{path} is visible to the command: {}",
            env.content
        );
    }

    // It writes as nsd's worker uid (never root, never toolfs), through the root only.
    let env = shell(&root, "echo made > /work/made.txt").await;
    assert_eq!(env.status, Status::Ok, "{}", env.content);
    assert_eq!(
        std::fs::metadata(dir.join("made.txt")).unwrap().uid(),
        nsd_worker_uid()
    );

    // Its network is its own: loopback only.
    let env = shell(&root, "cat /proc/net/dev").await;
    let interfaces: Vec<&str> = env
        .content
        .lines()
        .filter_map(|l| l.split_once(':').map(|(name, _)| name.trim()))
        .collect();
    assert_eq!(interfaces, ["lo"], "{}", env.content);
}

/// The worker's lock-down is the namespace payload's (warren-jail's one sequence): its seccomp
/// filters leave a shell command no socket family but AF_UNIX, AF_INET and AF_INET6, so `ip`
/// cannot open the netlink socket it would list the interfaces through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shell_command_gets_no_netlink_socket_past_the_workers_seccomp_filters() {
    let d = Daemon::start();
    let (_c, root, _dir) = shell_on_work(&d, false).await;
    let env = shell(&root, "ip -o link show && echo LISTED || echo refused").await;
    assert!(
        env.content.contains("refused") && !env.content.contains("LISTED"),
        "{}",
        env.content
    );
    assert!(
        env.content.contains("Address family not supported"),
        "{}",
        env.content
    );
}

/// A `-r` root is bound read-only in the worker: the command cannot write it, whatever the
/// file modes on the host say.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_root_is_read_only_to_the_command() {
    let d = Daemon::start();
    let (_c, root, dir) = shell_on_work(&d, false).await;
    let env = shell(&root, "echo x > /work/made.txt").await;
    assert_eq!(env.status, Status::Error, "{}", env.content);
    assert!(env.content.contains("Read-only"), "{}", env.content);
    assert!(!dir.join("made.txt").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_nsd_down_a_worker_call_is_denied_and_nothing_runs() {
    let mut d = Daemon::start();
    d.stack_mut().kill_nsd();
    let (_c, root, dir) = shell_on_work(&d, true).await;
    let env = shell(&root, "touch /work/ran").await;
    assert_eq!(env.status, Status::Denied, "{}", env.content);
    assert!(env.content.contains("nsd"), "{}", env.content);
    assert!(!dir.join("ran").exists(), "the command ran without nsd");
    assert!(
        d.workers().is_empty(),
        "toolfs started a worker itself: {:?}",
        d.workers()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_nsd_refuses_to_build_denies_the_call() {
    let d = Daemon::start();
    // A root inside the worker's own /usr: nsd refuses the build, naming why.
    let (_dir, fd) = tool_root(&d, "sys");
    let (_c, root) = d
        .granted(&record_with_root(&["fs_read"], "/usr/share"), &[fd.as_fd()])
        .await;
    let env = call_envelope(&root, "fs_read", br#"{"path":"/usr/share/x"}"#).await;
    assert_eq!(env.status, Status::Denied, "{}", env.content);
    assert!(env.content.contains("worker's own /usr"), "{}", env.content);
    assert!(d.workers().is_empty());
}

/// A shell call's background job cannot outlive it: a `setsid sleep 1000 &` started by a shell call is gone after the
/// call's timeout — the command is pid 1 of a pid namespace of its own inside its confined
/// worker, killed whole (tools_shell.rs has the control that shows setsid escaping without it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_setsid_job_of_a_confined_shell_call_is_gone_after_its_timeout() {
    let d = Daemon::start();
    let (_c, root, _dir) = shell_on_work(&d, true).await;
    let env = shell(&root, "echo $$").await;
    assert_eq!(env.content.lines().next(), Some("1"), "{}", env.content);
    let job = unique_sleep();
    let args = serde_json::json!({
        "command": format!("setsid sleep {job} >/dev/null 2>&1 </dev/null & sleep 1000"),
        "timeout_s": 2,
    })
    .to_string();
    let env = call_envelope(&root, "shell", args.as_bytes()).await;
    assert!(env.content.contains("timed out"), "{}", env.content);
    let gone = wait_no_process_with_arg(&job);
    for pid in pids_with_arg(&job) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    assert!(gone, "the setsid job outlived its call");
    // The worker serves on.
    let env = shell(&root, "echo again").await;
    assert_eq!(env.status, Status::Ok, "{}", env.content);
}

/// nsd builds workers for toolfs's uid and root only: with the socket opened wide, any other
/// uid is hung up on without an answer (and a worker is never built for it).
#[test]
fn nsd_builds_workers_for_toolfs_and_root_only() {
    use std::os::unix::fs::PermissionsExt;
    let nsd = common::stack::Nsd::start();
    for p in [nsd.dir.path().to_path_buf(), nsd.dir.path().join("run")] {
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::set_permissions(nsd.control(), std::fs::Permissions::from_mode(0o666)).unwrap();
    let request = serde_json::json!({
        "version": 1, "session": "0".repeat(32), "namespace": "x", "tool": "shell",
        "roots": [], "network": false,
    })
    .to_string();
    assert_eq!(frame_as_nobody(&nsd.control(), &request), "closed");
    assert!(
        nsd.log()
            .contains("worker socket: refused a peer: uid 65534 is neither toolfs nor root"),
        "{}",
        nsd.log()
    );
    // Root (as toolfs runs in these tests) gets its worker.
    let w = nsd.worker(
        "shell",
        &warren_toolfs::worker::ToolAuthority {
            roots: vec![],
            network: false,
        },
    );
    assert!(w.is_ok(), "{:?}", w.err());
}

/// A confined worker that stops answering is ended through its lifeline at the call's timeout:
/// toolfs (which may not signal the worker's uid) closes it, nsd's holder kills the worker's pid
/// namespace, and the holder's pidfd says when.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_confined_worker_is_ended_through_its_lifeline() {
    let nsd = common::stack::Nsd::start();
    let scratch = tempfile::Builder::new()
        .prefix("wstk")
        .tempdir_in("/tmp")
        .unwrap();
    let authority = tools_support::authority(&[("/r", scratch.path(), false)]);
    let w = nsd.worker("fs_read", &authority).unwrap();
    let holder = w.pid() as u32;
    let worker = live_children(holder);
    assert_eq!(worker.len(), 1, "the holder's one child is the worker");
    let worker = nix::unistd::Pid::from_raw(worker[0] as i32);
    nix::sys::signal::kill(worker, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let err = w
        .call(br#"{"path":"x"}"#, std::time::Duration::from_millis(500))
        .await
        .expect_err("a stopped worker cannot answer");
    assert_eq!(err.kind(), std::io::ErrorKind::TimedOut, "{err}");
    assert!(!w.is_alive());
    // Ended before `call` returned: the holder saw the lifeline close, killed and reaped it.
    let gone = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
            s.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
        })
    };
    assert!(gone(worker.as_raw()), "the worker outlived its lifeline");
    assert!(gone(holder as i32), "the holder outlived its worker");
}
