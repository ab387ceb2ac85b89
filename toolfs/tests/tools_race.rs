//! THE RACE TEST (issue 2, "Done when"): while a thread keeps swapping path components for
//! symlinks that point out of the root (to a directory the test watches), 10,000 fs_write calls
//! run through real workers; nothing is ever written outside the root.
//!
//! The watched tree is owned by the worker uid, so an escaped write would succeed there; every
//! directory's mtime/ctime and every file's content and times are compared before and after, so
//! even a temp file created and removed again outside would show. A control run of the same
//! swapper against a naive writer (plain path-based writes) shows the swapper does redirect
//! writes and that the watch sees it.

mod tools_support;

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, symlink};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};
use serde_json::json;
use tools_support::*;

const CALLS: usize = 10_000;
const WORKERS: usize = 4;
const FILES: usize = 8;

/// What the watch compares for one path.
#[derive(Debug, PartialEq, Eq)]
struct Observed {
    kind: &'static str,
    size: u64,
    content: Vec<u8>,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

/// Everything observable about a tree: per path, its type, size, content, mtime and ctime.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Observed> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let meta = std::fs::symlink_metadata(&path).unwrap();
        let kind = if meta.is_dir() {
            "dir"
        } else if meta.file_type().is_symlink() {
            "symlink"
        } else {
            "file"
        };
        let content = if meta.is_file() {
            std::fs::read(&path).unwrap()
        } else {
            Vec::new()
        };
        let observed = Observed {
            kind,
            size: meta.size(),
            content,
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        };
        out.insert(path.clone(), observed);
        if meta.is_dir() {
            for entry in std::fs::read_dir(&path).unwrap() {
                stack.push(entry.unwrap().path());
            }
        }
    }
    out
}

/// The watched tree outside the root: `d/e/` with the very names the writes aim at.
fn make_outside(scratch: &Scratch) -> PathBuf {
    let outside = scratch.worker_dir("outside");
    std::fs::create_dir_all(outside.join("d/e")).unwrap();
    for dir in ["d", "d/e"] {
        std::os::unix::fs::chown(outside.join(dir), Some(WORKER_UID), Some(WORKER_GID)).unwrap();
    }
    for k in 0..FILES {
        worker_file(&outside.join(format!("d/e/f{k}.txt")), b"sentinel");
    }
    outside
}

/// The root: real `d/e/`, plus symlinks ready to be exchanged with them (absolute and relative,
/// to directories and to files outside).
fn make_root(scratch: &Scratch, outside: &Path) -> PathBuf {
    let root = scratch.worker_dir("root");
    std::fs::create_dir_all(root.join("d/e")).unwrap();
    for dir in ["d", "d/e"] {
        std::os::unix::fs::chown(root.join(dir), Some(WORKER_UID), Some(WORKER_GID)).unwrap();
    }
    symlink(outside.join("d"), root.join("d.abs")).unwrap();
    symlink("../outside/d", root.join("d.rel")).unwrap();
    symlink(outside.join("d/e"), root.join("d/e.abs")).unwrap();
    symlink("../../outside/d/e", root.join("d/e.rel")).unwrap();
    for k in 0..FILES {
        worker_file(&root.join(format!("d/e/f{k}.txt")), b"start");
        symlink(
            outside.join(format!("d/e/f{k}.txt")),
            root.join(format!("d/e/f{k}.lnk")),
        )
        .unwrap();
    }
    root
}

/// Atomically exchanges a directory or file with a symlink pointing out of the root, and back,
/// again and again. A write that lands on a file while its symlink is swapped in replaces the
/// symlink with a regular file; the symlink is then re-armed so the pressure stays on.
fn swapper(root: PathBuf, outside: PathBuf, stop: Arc<AtomicBool>, swaps: Arc<AtomicU64>) {
    let mut pairs: Vec<(PathBuf, PathBuf, PathBuf)> = vec![
        (root.join("d"), root.join("d.abs"), outside.join("d")),
        (
            root.join("d"),
            root.join("d.rel"),
            PathBuf::from("../outside/d"),
        ),
        (root.join("d/e"), root.join("d/e.abs"), outside.join("d/e")),
        (
            root.join("d/e"),
            root.join("d/e.rel"),
            PathBuf::from("../../outside/d/e"),
        ),
    ];
    for k in 0..FILES {
        let name = format!("d/e/f{k}");
        pairs.push((
            root.join(format!("{name}.txt")),
            root.join(format!("{name}.lnk")),
            outside.join(format!("{name}.txt")),
        ));
    }
    while !stop.load(Ordering::Relaxed) {
        for (real, link, target) in &pairs {
            let exchange =
                || renameat2(AT_FDCWD, real, AT_FDCWD, link, RenameFlags::RENAME_EXCHANGE);
            exchange().expect("swap in");
            std::thread::yield_now();
            exchange().expect("swap back");
            swaps.fetch_add(1, Ordering::Relaxed);
            if !std::fs::symlink_metadata(link)
                .unwrap()
                .file_type()
                .is_symlink()
            {
                std::fs::remove_file(link).unwrap();
                symlink(target, link).unwrap();
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_fs_write_escapes_the_root_while_symlinks_are_swapped_in() {
    let scratch = Scratch::new();
    let outside = make_outside(&scratch);
    let root = make_root(&scratch, &outside);
    let before = snapshot(&outside);

    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicU64::new(0));
    let swapping = {
        let (root, outside, stop, swaps) =
            (root.clone(), outside.clone(), stop.clone(), swaps.clone());
        std::thread::spawn(move || swapper(root, outside, stop, swaps))
    };
    let started = Instant::now();
    let mut tasks = Vec::new();
    for n in 0..WORKERS {
        let worker = spawn("fs_write", &[("/r", &root, true)]);
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
    let after = snapshot(&outside);
    for (path, state) in &after {
        assert_eq!(
            before.get(path),
            Some(state),
            "{} changed or appeared outside the root",
            path.display()
        );
    }
    assert_eq!(
        before.len(),
        after.len(),
        "something outside the root disappeared"
    );
}

/// The control: the same swapper redirects a naive path-based writer out of the root, and the
/// snapshot sees it. Without this, the test above could pass with a swapper that never bites.
#[test]
fn control_a_naive_writer_does_escape_and_is_detected() {
    let scratch = Scratch::new();
    let outside = make_outside(&scratch);
    let root = make_root(&scratch, &outside);
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
