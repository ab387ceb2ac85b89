//! The worker binary at the protocol level, driven frame by frame (specs/worker-protocol.md):
//! malformed frames, a disagreeing hello, bad argv, and toolfs going away in the middle of a call.

mod tools_support;

use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::fcntl::{FcntlArg, FdFlag, OFlag, fcntl, open};
use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
use nix::sys::stat::Mode;
use tools_support::*;
use warren_toolfs::worker::protocol::{
    FromWorker, Incoming, MAX_FRAME, PROTOCOL_VERSION, RootConfig, ToWorker, encode,
    read_frame_blocking,
};
use warren_toolfs::worker::worker_program;

struct RawWorker {
    child: Child,
    socket: UnixStream,
}

/// Starts the worker binary by hand: argv names `tool`, its socket and one root.
fn start(argv_tool: &str, root: &Path) -> RawWorker {
    let (ours, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::Stream,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .unwrap();
    let root_fd = open(
        root,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .unwrap();
    // Only these two cross exec; they are closed here right after the spawn.
    for fd in [&theirs, &root_fd] {
        fcntl(fd, FcntlArg::F_SETFD(FdFlag::empty())).unwrap();
    }
    let child = Command::new(worker_program().unwrap())
        .args([
            argv_tool.to_string(),
            theirs.as_raw_fd().to_string(),
            root_fd.as_raw_fd().to_string(),
        ])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    RawWorker {
        child,
        socket: UnixStream::from(ours),
    }
}

fn hello(tool: &str) -> ToWorker {
    ToWorker::Hello {
        version: PROTOCOL_VERSION,
        tool: tool.into(),
        uid: WORKER_UID,
        gid: WORKER_GID,
        network: false,
        roots: vec![RootConfig {
            path: "/r".into(),
            writable: true,
        }],
    }
}

impl RawWorker {
    fn send(&mut self, message: &ToWorker) {
        self.socket.write_all(&encode(message).unwrap()).unwrap();
    }

    fn send_body(&mut self, body: &[u8]) {
        self.socket
            .write_all(&(body.len() as u32).to_le_bytes())
            .unwrap();
        self.socket.write_all(body).unwrap();
    }

    fn recv(&mut self) -> FromWorker {
        match read_frame_blocking(&mut self.socket).unwrap() {
            Incoming::Frame(body) => serde_json::from_slice(&body).unwrap(),
            Incoming::Oversized(n) => panic!("oversized answer {n}"),
            Incoming::Eof => panic!("the worker closed its socket"),
        }
    }

    fn started(tool: &str, root: &Path) -> RawWorker {
        let mut worker = start(tool, root);
        worker.send(&hello(tool));
        match worker.recv() {
            FromWorker::Ready { uid, gid, .. } => assert_eq!((uid, gid), (WORKER_UID, WORKER_GID)),
            other => panic!("expected ready, got {other:?}"),
        }
        worker
    }

    /// Waits (bounded) for the process to exit; its status, or None if it still runs.
    fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        let until = Instant::now() + Duration::from_secs(20);
        while Instant::now() < until {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }
}

impl Drop for RawWorker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[track_caller]
fn assert_refused_frame(answer: FromWorker, needle: &str) {
    match answer {
        FromWorker::Done {
            id: 0,
            ok: false,
            content,
        } => assert!(content.contains(needle), "{content:?} lacks {needle:?}"),
        other => panic!("expected an id-0 refusal, got {other:?}"),
    }
}

#[test]
fn malformed_frames_get_an_error_answer_and_the_worker_goes_on() {
    let scratch = Scratch::new();
    let root = scratch.worker_dir("root");
    let mut w = RawWorker::started("fs_list", &root);

    w.send_body(b"not json");
    assert_refused_frame(w.recv(), "malformed request");
    w.send_body(br#"{"type":"call","id":5}"#);
    assert_refused_frame(w.recv(), "malformed request");
    w.send_body(br#"{"type":"call","id":5,"args":"{}","timeout_ms":1,"sneaky":true}"#);
    assert_refused_frame(w.recv(), "malformed request");
    w.send(&hello("fs_list"));
    assert_refused_frame(w.recv(), "hello after start");
    // An over-long frame is read to its end and refused; the stream stays in step.
    let huge = vec![b' '; MAX_FRAME + 1];
    w.send_body(&huge);
    assert_refused_frame(w.recv(), "too large");

    w.send(&ToWorker::Call {
        id: 9,
        args: r#"{"path":"."}"#.into(),
        timeout_ms: 10_000,
    });
    match w.recv() {
        FromWorker::Done {
            id: 9, ok: true, ..
        } => {}
        other => panic!("expected call 9 to succeed, got {other:?}"),
    }
}

#[test]
fn a_hello_that_disagrees_with_argv_is_fatal() {
    let scratch = Scratch::new();
    let root = scratch.worker_dir("root");
    let mut w = start("fs_read", &root);
    w.send(&hello("shell"));
    match w.recv() {
        FromWorker::Fatal { message } => assert!(message.contains("argv"), "{message}"),
        other => panic!("expected fatal, got {other:?}"),
    }
    let status = w.exit_status().expect("the worker exits after fatal");
    assert!(!status.success());
}

#[test]
fn without_its_fds_the_binary_refuses_to_run() {
    for args in [
        &[][..],
        &["fs_read"][..],
        &["fs_read", "1"][..],
        &["fs_read", "0"][..],
    ] {
        let out = Command::new(worker_program().unwrap())
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("started by toolfs only"));
    }
}

#[test]
fn toolfs_going_away_mid_call_kills_the_command_group() {
    let scratch = Scratch::new();
    let root = scratch.worker_dir("root");
    let mut w = RawWorker::started("shell", &root);
    let job = unique_sleep();
    let command = format!("sleep {job} >/dev/null 2>&1 & touch started; sleep 1000");
    w.send(&ToWorker::Call {
        id: 1,
        args: serde_json::json!({ "command": command }).to_string(),
        timeout_ms: 600_000,
    });
    let group = match w.recv() {
        FromWorker::Started { id: 1, pgid } => pgid,
        other => panic!("expected started, got {other:?}"),
    };
    let until = Instant::now() + Duration::from_secs(20);
    while (!root.join("started").exists() || pids_with_arg(&job).is_empty())
        && Instant::now() < until
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        !pids_with_arg(&job).is_empty(),
        "the background job never ran"
    );
    // toolfs dies: its end of the socket closes (the process is still ours to reap).
    w.socket.shutdown(std::net::Shutdown::Both).unwrap();
    let status = w
        .exit_status()
        .expect("the worker ends when toolfs goes away");
    assert!(!status.success(), "it could not deliver its answer");
    assert!(
        wait_no_process_with_arg(&job),
        "the command's background job (group {group}) outlived the call"
    );
}
