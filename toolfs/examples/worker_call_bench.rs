//! Benchmark: what one worker call costs. Side by side in one run, on the same 4 KiB file:
//! - `fs_read` through a live worker (socketpair round trip + openat2 twice + read),
//! - a fresh `cat` process per read (the per-call-process design workers avoid),
//! - the same read in-process with std (the floor).
//!
//! Prints µs per call and the ratios. Needs root (the worker drops to uid 65534).
//! Run: `cargo run --release -p warren-toolfs --example worker_call_bench [calls]`

use std::os::unix::fs::chown;
use std::process::Command;
use std::time::{Duration, Instant};

use nix::fcntl::{OFlag, open};
use nix::sys::stat::Mode;
use warren_toolfs::worker::{Root, ToolAuthority, Worker};

const UID: u32 = 65534;

fn per_call(total: Duration, calls: usize) -> f64 {
    total.as_secs_f64() * 1e6 / calls as f64
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let calls: usize = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(5000);
    let dir = tempfile::Builder::new()
        .prefix("wb")
        .tempdir_in("/tmp")
        .expect("tempdir");
    chown(dir.path(), Some(UID), Some(UID)).expect("chown (run as root)");
    let file = dir.path().join("f.txt");
    std::fs::write(&file, "x".repeat(4096)).unwrap();
    let root = Root {
        path: "/r".into(),
        dir: open(
            dir.path(),
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .unwrap(),
        writable: false,
    };
    let worker = Worker::spawn_unconfined(
        "fs_read",
        &ToolAuthority {
            roots: vec![root],
            network: false,
        },
        UID,
        UID,
    )
    .expect("spawn");
    let args = br#"{"path":"f.txt"}"#;

    for _ in 0..100 {
        worker.call(args, Duration::from_secs(10)).await.unwrap();
    }
    let start = Instant::now();
    for _ in 0..calls {
        let out = worker.call(args, Duration::from_secs(10)).await.unwrap();
        assert!(out.ok && out.content.len() == 4096);
    }
    let worker_us = per_call(start.elapsed(), calls);

    let cat_calls = (calls / 10).max(50);
    let start = Instant::now();
    for _ in 0..cat_calls {
        let out = Command::new("cat").arg(&file).output().unwrap();
        assert_eq!(out.stdout.len(), 4096);
    }
    let cat_us = per_call(start.elapsed(), cat_calls);

    let start = Instant::now();
    for _ in 0..calls {
        assert_eq!(std::fs::read(&file).unwrap().len(), 4096);
    }
    let inproc_us = per_call(start.elapsed(), calls);

    println!("fs_read via worker:      {worker_us:8.1} µs/call ({calls} calls)");
    println!(
        "fresh `cat` per call:    {cat_us:8.1} µs/call ({cat_calls} calls)  ratio cat/worker = {:.1}",
        cat_us / worker_us
    );
    println!(
        "in-process std::fs read: {inproc_us:8.1} µs/call ({calls} calls)  ratio worker/in-process = {:.1}",
        worker_us / inproc_us
    );
}
