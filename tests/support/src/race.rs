//! The symlink-swap race's fixtures: a watched tree outside a tool's root, the root
//! with symlinks ready to be exchanged into it, the swapper, and the watch: toolfs's
//! tools_race.rs and warren's test of the same race from inside `warren run`.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, symlink};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};

/// The files the writes aim at (`d/e/f<k>.txt`).
pub const FILES: usize = 8;

/// What the watch compares for one path.
#[derive(Debug, PartialEq, Eq)]
pub struct Observed {
    kind: &'static str,
    size: u64,
    content: Vec<u8>,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

/// Everything observable about a tree: per path, its type, size, content, mtime and ctime.
pub fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Observed> {
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

/// Asserts that the tree at `dir` is exactly as `before` (a [`snapshot`]) saw it: no path
/// changed, appeared or disappeared.
pub fn assert_untouched(dir: &Path, before: &BTreeMap<PathBuf, Observed>) {
    let after = snapshot(dir);
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

/// A directory or file under `base`, owned by `uid` (the worker's, so a write that escaped
/// would succeed).
fn owned_dir(path: &Path, uid: u32) {
    std::fs::create_dir_all(path).unwrap();
    std::os::unix::fs::chown(path, Some(uid), Some(uid)).unwrap();
}

fn owned_file(path: &Path, content: &[u8], uid: u32) {
    std::fs::write(path, content).unwrap();
    std::os::unix::fs::chown(path, Some(uid), Some(uid)).unwrap();
}

/// The watched tree outside the root, `<base>/outside`: `d/e/` with the very names the writes
/// aim at, owned by `uid`.
pub fn make_outside(base: &Path, uid: u32) -> PathBuf {
    let outside = base.join("outside");
    for dir in ["", "d", "d/e"] {
        owned_dir(&outside.join(dir), uid);
    }
    for k in 0..FILES {
        owned_file(&outside.join(format!("d/e/f{k}.txt")), b"sentinel", uid);
    }
    outside
}

/// The root: real `d/e/`, plus symlinks ready to be exchanged with them (absolute and relative,
/// to directories and to files outside).
pub fn make_root(base: &Path, outside: &Path, uid: u32) -> PathBuf {
    let root = base.join("root");
    for dir in ["", "d", "d/e"] {
        owned_dir(&root.join(dir), uid);
    }
    symlink(outside.join("d"), root.join("d.abs")).unwrap();
    symlink("../outside/d", root.join("d.rel")).unwrap();
    symlink(outside.join("d/e"), root.join("d/e.abs")).unwrap();
    symlink("../../outside/d/e", root.join("d/e.rel")).unwrap();
    for k in 0..FILES {
        owned_file(&root.join(format!("d/e/f{k}.txt")), b"start", uid);
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
pub fn swapper(root: PathBuf, outside: PathBuf, stop: Arc<AtomicBool>, swaps: Arc<AtomicU64>) {
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
