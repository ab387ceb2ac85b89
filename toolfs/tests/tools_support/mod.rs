//! Shared fixtures for the tools_* and worker_* tests: scratch dirs under /tmp owned by the
//! worker uid, authorities built from them, workers and calls.
#![allow(dead_code)]

use std::os::fd::OwnedFd;
use std::os::unix::fs::chown;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::fcntl::{OFlag, open};
use nix::sys::stat::Mode;
use serde_json::Value;
use warren_toolfs::worker::{Root, ToolAuthority, Worker, WorkerOutput};

/// The unprivileged uid/gid the test workers run as (`nobody`/`nogroup`).
pub const WORKER_UID: u32 = 65534;
pub const WORKER_GID: u32 = 65534;
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// A short temp dir under /tmp, removed on drop.
pub struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    pub fn new() -> Scratch {
        let dir = tempfile::Builder::new()
            .prefix("wt")
            .tempdir_in("/tmp")
            .expect("tempdir");
        Scratch { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A directory owned by the worker uid (so a tool may write in it).
    pub fn worker_dir(&self, name: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::create_dir_all(&path).unwrap();
        chown(&path, Some(WORKER_UID), Some(WORKER_GID)).unwrap();
        path
    }
}

/// Writes a file owned by the worker uid.
pub fn worker_file(path: &Path, content: &[u8]) {
    std::fs::write(path, content).unwrap();
    chown(path, Some(WORKER_UID), Some(WORKER_GID)).unwrap();
}

pub fn open_dir(path: &Path) -> OwnedFd {
    open(
        path,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .expect("open root")
}

/// An authority of `(path the tool sees, host dir, writable)` roots, no network.
pub fn authority(roots: &[(&str, &Path, bool)]) -> ToolAuthority {
    ToolAuthority {
        roots: roots
            .iter()
            .map(|(path, host, writable)| Root {
                path: path.to_string(),
                dir: open_dir(host),
                writable: *writable,
            })
            .collect(),
        network: false,
    }
}

pub fn spawn(tool: &str, roots: &[(&str, &Path, bool)]) -> Worker {
    Worker::spawn_unconfined(tool, &authority(roots), WORKER_UID, WORKER_GID).expect("spawn worker")
}

/// One call with JSON arguments.
pub async fn call(worker: &Worker, args: Value) -> WorkerOutput {
    let bytes = serde_json::to_vec(&args).unwrap();
    worker
        .call(&bytes, CALL_TIMEOUT)
        .await
        .expect("worker call")
}

/// Asserts a refusal whose message contains every one of `needles`.
#[track_caller]
pub fn assert_refused(out: &WorkerOutput, needles: &[&str]) {
    assert!(!out.ok, "expected a refusal, got ok: {}", out.content);
    for needle in needles {
        assert!(
            out.content.contains(needle),
            "refusal {:?} does not mention {needle:?}",
            out.content
        );
    }
}

#[track_caller]
pub fn assert_ok(out: &WorkerOutput) -> &str {
    assert!(out.ok, "expected ok, got error: {}", out.content);
    &out.content
}

/// Whether `pid` no longer runs: gone, or a zombie waiting for its reaper.
pub fn is_dead(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

/// Waits (at most 20 s: reaping an orphan is its new parent's business) for `pid` to be dead.
pub fn wait_dead(pid: i32) -> bool {
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while !is_dead(pid) && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    is_dead(pid)
}

/// Waits (at most 20 s) until `path` holds a complete line, and parses it as a pid.
pub fn wait_pid_file(path: &Path) -> i32 {
    let until = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(text) = std::fs::read_to_string(path)
            && text.ends_with('\n')
        {
            return text.trim().parse().expect("a pid");
        }
        assert!(
            std::time::Instant::now() < until,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Host pids of live (not zombie) processes whose command line has `arg` as an argument.
pub fn pids_with_arg(arg: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == arg.as_bytes()))
                && !is_dead(*pid)
        })
        .collect()
}

/// A `sleep` argument no other process has: the test finds its sleeper by it.
pub fn unique_sleep() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(1);
    format!(
        "1000.{}{:04}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Waits (at most 20 s) until no process has `arg` on its command line.
pub fn wait_no_process_with_arg(arg: &str) -> bool {
    wait_no_process_with_arg_for(arg, Duration::from_secs(20))
}

/// Waits (at most `limit`) until no process has `arg` on its command line.
pub fn wait_no_process_with_arg_for(arg: &str, limit: Duration) -> bool {
    for _ in 0..limit.as_millis() / 10 {
        if pids_with_arg(arg).is_empty() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}
