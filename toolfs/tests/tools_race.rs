//! THE RACE TEST (what a file tool's path resolution must survive): while a thread keeps swapping path components for
//! symlinks that point out of the root (to a directory the test watches), 10,000 fs_write calls
//! run through real workers; nothing is ever written outside the root.
//!
//! The watched tree is owned by the worker uid, so an escaped write would succeed there; every
//! directory's mtime/ctime and every file's content and times are compared before and after, so
//! even a temp file created and removed again outside would show. A control run of the same
//! swapper against a naive writer (plain path-based writes) shows the swapper does redirect
//! writes and that the watch sees it.

mod common;
mod tools_support;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use serde_json::json;
use tools_support::*;
use warren_test_support::race::*;

const CALLS: usize = 10_000;
const WORKERS: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_fs_write_escapes_the_root_while_symlinks_are_swapped_in() {
    let scratch = Scratch::new();
    let outside = make_outside(scratch.path(), WORKER_UID);
    let root = make_root(scratch.path(), &outside, WORKER_UID);
    let workers = (0..WORKERS)
        .map(|_| spawn("fs_write", &[("/r", &root, true)]))
        .collect();
    race(workers, &root, &outside).await;
}

/// The same race through confined workers: each built by the real nsd (this test plays
/// toolfs's part on nsd's worker socket) in namespaces of its own, the root bound at /r from the
/// fd handed over, under nsd's worker uid (which owns the watched tree, so an escaped write
/// would succeed there too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_fs_write_escapes_a_confined_worker_built_by_nsd() {
    let scratch = Scratch::new();
    let uid = warren_daemon::identity::Role::Worker.uid();
    let outside = make_outside(scratch.path(), uid);
    let root = make_root(scratch.path(), &outside, uid);
    let nsd = common::stack::Nsd::start();
    let workers = (0..WORKERS)
        .map(|_| {
            nsd.worker("fs_write", &authority(&[("/r", &root, true)]))
                .unwrap_or_else(|e| panic!("nsd built no worker: {e}\n{}", nsd.log()))
        })
        .collect();
    race(workers, &root, &outside).await;
}

/// 10,000 fs_write calls spread over `workers` while the swapper runs; then nothing outside
/// the root may have changed.
async fn race(workers: Vec<warren_toolfs::worker::Worker>, root: &Path, outside: &Path) {
    let before = snapshot(outside);
    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicU64::new(0));
    let swapping = {
        let (root, outside, stop, swaps) = (
            root.to_path_buf(),
            outside.to_path_buf(),
            stop.clone(),
            swaps.clone(),
        );
        std::thread::spawn(move || swapper(root, outside, stop, swaps))
    };
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (n, worker) in workers.into_iter().enumerate() {
        tasks.push(tokio::spawn(async move {
            let (mut written, mut refused) = (0u64, 0u64);
            for i in (n..CALLS).step_by(WORKERS) {
                let k = i % FILES;
                let path = if i % 3 == 0 { format!("/r/d/e/f{k}.txt") } else { format!("d/e/f{k}.txt") };
                let args = json!({"path": path, "content": format!("call {i}\n"), "create_dirs": i % 2 == 0});
                let out = worker.call(&serde_json::to_vec(&args).unwrap(), CALL_TIMEOUT).await.expect("the worker answers every call");
                if out.ok { written += 1 } else { refused += 1 }
            }
            (written, refused)
        }));
    }
    let (mut written, mut refused) = (0, 0);
    for task in tasks {
        let (w, r) = task.await.unwrap();
        written += w;
        refused += r;
    }
    stop.store(true, Ordering::Relaxed);
    swapping.join().unwrap();
    let elapsed = started.elapsed();
    let swaps = swaps.load(Ordering::Relaxed);
    println!(
        "{CALLS} fs_write calls on {WORKERS} workers in {elapsed:.1?}: {written} written inside, {refused} refused; {swaps} symlink swaps"
    );

    assert_eq!(written + refused, CALLS as u64);
    assert!(swaps > 0, "the swapper never swapped");
    assert!(
        written > 0,
        "no write succeeded: the test exercised only refusals"
    );
    assert_untouched(outside, &before);
}

/// The control: the same swapper redirects a naive path-based writer out of the root, and the
/// snapshot sees it. Without this, the test above could pass with a swapper that never bites.
#[test]
fn control_a_naive_writer_does_escape_and_is_detected() {
    let scratch = Scratch::new();
    let outside = make_outside(scratch.path(), WORKER_UID);
    let root = make_root(scratch.path(), &outside, WORKER_UID);
    let before = snapshot(&outside);
    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicU64::new(0));
    let swapping = {
        let (root, outside, stop, swaps) =
            (root.clone(), outside.clone(), stop.clone(), swaps.clone());
        std::thread::spawn(move || swapper(root, outside, stop, swaps))
    };
    let mut escaped = false;
    for i in 0..CALLS * 10 {
        let _ = std::fs::write(
            root.join(format!("d/e/f{}.txt", i % FILES)),
            format!("naive {i}\n"),
        );
        if i % 100 == 99 && snapshot(&outside) != before {
            escaped = true;
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    swapping.join().unwrap();
    assert!(
        escaped,
        "the naive writer never escaped: the swapper or the watch is broken"
    );
}
