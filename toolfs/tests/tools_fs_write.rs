//! fs_write and fs_edit through a real worker process: atomic replacement, owner and mode kept,
//! the version ring, read-only roots, the deny-list, elision markers, non-regular targets.

mod tools_support;

use std::os::unix::fs::{MetadataExt, PermissionsExt, chown, symlink};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use nix::sys::stat::Mode;
use nix::unistd::mkfifo;
use serde_json::json;
use tools_support::*;

fn versions_of(root: &Path) -> Vec<Vec<String>> {
    let ring = root.join(".warren-versions");
    let mut files = Vec::new();
    for entry in std::fs::read_dir(ring).unwrap() {
        let dir = entry.unwrap().path();
        let mut stamps: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n != "path")
            .collect();
        stamps.sort();
        files.push(
            stamps
                .iter()
                .map(|s| std::fs::read_to_string(dir.join(s)).unwrap())
                .collect(),
        );
    }
    files
}

/// The result names where the file landed, as the kernel resolved it (`RESOLVE_IN_ROOT`), not
/// the argument as written: `..` at the root is clamped there, so `/repo/docs/../.git/hooks/x`
/// lands at, and is reported as, `/repo/docs/.git/hooks/x`; a symlinked directory is named as
/// its target; fs_edit says the same.
#[tokio::test]
async fn a_write_names_the_path_it_resolved_not_the_argument() {
    let scratch = Scratch::new();
    let docs = scratch.worker_dir("docs");
    scratch.worker_dir("docs/real/sub");
    symlink("real", docs.join("link")).unwrap();
    let w = spawn("fs_write", &[("/repo/docs", &docs, true)]);
    let out = call(
        &w,
        json!({"path": "/repo/docs/../.git/hooks/pre-push", "content": "x", "create_dirs": true}),
    )
    .await;
    assert_eq!(
        assert_ok(&out),
        "created /repo/docs/.git/hooks/pre-push (1 bytes)"
    );
    assert!(docs.join(".git/hooks/pre-push").is_file());
    let out = call(&w, json!({"path": "real/../../../b.txt", "content": "y"})).await;
    assert_eq!(assert_ok(&out), "created /repo/docs/b.txt (1 bytes)");
    let out = call(&w, json!({"path": "link/sub/c.txt", "content": "z"})).await;
    assert_eq!(
        assert_ok(&out),
        "created /repo/docs/real/sub/c.txt (1 bytes)"
    );
    let edit = spawn("fs_edit", &[("/repo/docs", &docs, true)]);
    let out = call(
        &edit,
        json!({"path": "/repo/docs/link/../../real/sub/c.txt", "old": "z", "new": "zz"}),
    )
    .await;
    assert_eq!(
        assert_ok(&out),
        "replaced /repo/docs/real/sub/c.txt (2 bytes)"
    );
}

#[tokio::test]
async fn fs_write_creates_and_replaces_keeping_owner_and_mode() {
    let scratch = Scratch::new();
    let repo = scratch.worker_dir("repo");
    let w = spawn("fs_write", &[("/r", &repo, true)]);

    assert_eq!(
        assert_ok(&call(&w, json!({"path": "new.txt", "content": "one"})).await),
        "created /r/new.txt (3 bytes)"
    );
    assert_eq!(
        std::fs::read_to_string(repo.join("new.txt")).unwrap(),
        "one"
    );
    let meta = std::fs::metadata(repo.join("new.txt")).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o777), (WORKER_UID, 0o644));

    worker_file(&repo.join("kept.sh"), b"#!/bin/sh\n");
    std::fs::set_permissions(repo.join("kept.sh"), std::fs::Permissions::from_mode(0o750)).unwrap();
    let before = std::fs::metadata(repo.join("kept.sh")).unwrap();
    let out = call(
        &w,
        json!({"path": "/r/kept.sh", "content": "#!/bin/sh\necho hi\n"}),
    )
    .await;
    assert_eq!(assert_ok(&out), "replaced /r/kept.sh (18 bytes)");
    let after = std::fs::metadata(repo.join("kept.sh")).unwrap();
    assert_eq!(
        std::fs::read_to_string(repo.join("kept.sh")).unwrap(),
        "#!/bin/sh\necho hi\n"
    );
    assert_eq!(
        (after.uid(), after.gid(), after.mode() & 0o7777),
        (before.uid(), before.gid(), 0o750)
    );
    assert_ne!(
        after.ino(),
        before.ino(),
        "replaced by rename, not rewritten in place"
    );

    // Another user's file cannot keep its owner when the worker replaces it: refused, untouched.
    std::fs::write(repo.join("theirs.txt"), "theirs").unwrap();
    chown(repo.join("theirs.txt"), Some(1000), Some(1000)).unwrap();
    std::fs::set_permissions(
        repo.join("theirs.txt"),
        std::fs::Permissions::from_mode(0o666),
    )
    .unwrap();
    assert_refused(
        &call(&w, json!({"path": "theirs.txt", "content": "mine"})).await,
        &["cannot keep its owner 1000:1000"],
    );
    assert_eq!(
        std::fs::read_to_string(repo.join("theirs.txt")).unwrap(),
        "theirs"
    );
    assert_eq!(
        std::fs::metadata(repo.join("theirs.txt")).unwrap().uid(),
        1000
    );

    // No temp file is left behind by either outcome.
    let leftovers: Vec<_> = std::fs::read_dir(&repo)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.contains("warren-tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[tokio::test]
async fn fs_write_makes_parents_only_when_asked() {
    let scratch = Scratch::new();
    let repo = scratch.worker_dir("repo");
    let w = spawn("fs_write", &[("/r", &repo, true)]);
    assert_refused(
        &call(&w, json!({"path": "a/b/c.txt", "content": "x"})).await,
        &["parent directory does not exist"],
    );
    assert!(!repo.join("a").exists());
    assert_ok(
        &call(
            &w,
            json!({"path": "a/b/c.txt", "content": "x", "create_dirs": true}),
        )
        .await,
    );
    assert_eq!(
        std::fs::read_to_string(repo.join("a/b/c.txt")).unwrap(),
        "x"
    );
}

#[tokio::test]
async fn fs_write_refuses_read_only_roots_secrets_and_non_regular_targets() {
    let scratch = Scratch::new();
    let repo = scratch.worker_dir("repo");
    let docs = scratch.worker_dir("docs");
    let outside = scratch.worker_dir("outside");
    worker_file(&docs.join("readme"), b"docs");
    worker_file(&outside.join("victim"), b"victim");
    symlink(outside.join("victim"), repo.join("link")).unwrap();
    mkfifo(&repo.join("pipe"), Mode::from_bits_truncate(0o666)).unwrap();
    std::fs::create_dir(repo.join("dir")).unwrap();
    let w = spawn("fs_write", &[("/r", &repo, true), ("/docs", &docs, false)]);

    assert_refused(
        &call(&w, json!({"path": "/docs/readme", "content": "changed"})).await,
        &["read-only"],
    );
    assert_refused(
        &call(&w, json!({"path": "/docs/new", "content": "new"})).await,
        &["read-only"],
    );
    assert_eq!(
        std::fs::read_to_string(docs.join("readme")).unwrap(),
        "docs"
    );
    assert!(!docs.join("new").exists());

    for name in [".env", "deploy.key", "id_rsa", "state.sqlite"] {
        assert_refused(
            &call(&w, json!({"path": name, "content": "x"})).await,
            &["deny-list"],
        );
        assert!(!repo.join(name).exists());
    }
    assert_refused(
        &call(&w, json!({"path": "link", "content": "through"})).await,
        &["symbolic link"],
    );
    assert_eq!(
        std::fs::read_to_string(outside.join("victim")).unwrap(),
        "victim"
    );
    assert!(
        std::fs::symlink_metadata(repo.join("link"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_refused(
        &call(&w, json!({"path": "pipe", "content": "x"})).await,
        &["fifo"],
    );
    assert_refused(
        &call(&w, json!({"path": "dir", "content": "x"})).await,
        &["dir"],
    );
    assert_refused(
        &call(
            &w,
            json!({"path": ".warren-versions/x", "content": "x", "create_dirs": true}),
        )
        .await,
        &["version ring"],
    );
}

#[tokio::test]
async fn elision_markers_are_refused_only_when_new_to_the_file() {
    let scratch = Scratch::new();
    let repo = scratch.worker_dir("repo");
    worker_file(&repo.join("main.rs"), b"fn main() {\n    // ...\n}\n");
    let w = spawn("fs_write", &[("/r", &repo, true)]);
    // The file already has `// ...`: keeping it is fine.
    assert_ok(
        &call(
            &w,
            json!({"path": "main.rs", "content": "fn main() {\n    // ...\n    run();\n}\n"}),
        )
        .await,
    );
    let out = call(
        &w,
        json!({"path": "main.rs", "content": "fn main() {\n    # ... rest unchanged\n}\n"}),
    )
    .await;
    assert_refused(&out, &["elision marker", "line 2"]);
    assert!(
        std::fs::read_to_string(repo.join("main.rs"))
            .unwrap()
            .contains("run();")
    );
    assert_refused(
        &call(
            &w,
            json!({"path": "new.html", "content": "<p>a</p>\n<!-- ... -->\n"}),
        )
        .await,
        &["elision marker"],
    );
    assert!(!repo.join("new.html").exists());

    let e = spawn("fs_edit", &[("/r", &repo, true)]);
    assert_refused(
        &call(
            &e,
            json!({"path": "main.rs", "old": "run();", "new": "/* ... */"}),
        )
        .await,
        &["elision marker"],
    );
    assert_ok(
        &call(
            &e,
            json!({"path": "main.rs", "old": "run();", "new": "// ...\n    go();"}),
        )
        .await,
    );
}

#[tokio::test]
async fn fs_edit_replaces_exactly_one_occurrence() {
    let scratch = Scratch::new();
    let repo = scratch.worker_dir("repo");
    worker_file(&repo.join("f.txt"), b"alpha beta gamma beta delta beta\n");
    std::fs::set_permissions(repo.join("f.txt"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let w = spawn("fs_edit", &[("/r", &repo, true)]);
    assert_refused(
        &call(&w, json!({"path": "f.txt", "old": "beta", "new": "B"})).await,
        &["occurs 3 times"],
    );
    assert_refused(
        &call(&w, json!({"path": "f.txt", "old": "omega", "new": "O"})).await,
        &["not found", "0 occurrences"],
    );
    assert_refused(
        &call(&w, json!({"path": "nope.txt", "old": "a", "new": "b"})).await,
        &["no such file"],
    );
    assert_refused(
        &call(&w, json!({"path": "id_rsa", "old": "a", "new": "b"})).await,
        &["deny-list", "id_*"],
    );
    assert_eq!(
        std::fs::read_to_string(repo.join("f.txt")).unwrap(),
        "alpha beta gamma beta delta beta\n"
    );
    assert_ok(
        &call(
            &w,
            json!({"path": "f.txt", "old": "gamma beta", "new": "GAMMA"}),
        )
        .await,
    );
    assert_eq!(
        std::fs::read_to_string(repo.join("f.txt")).unwrap(),
        "alpha beta GAMMA delta beta\n"
    );
    assert_eq!(
        std::fs::metadata(repo.join("f.txt")).unwrap().mode() & 0o777,
        0o600
    );
    assert_eq!(
        versions_of(&repo),
        vec![vec!["alpha beta gamma beta delta beta\n".to_string()]]
    );
}

#[tokio::test]
async fn fs_write_keeps_the_last_five_versions() {
    let scratch = Scratch::new();
    let repo = scratch.worker_dir("repo");
    let w = spawn("fs_write", &[("/r", &repo, true)]);
    for i in 1..=8 {
        assert_ok(
            &call(
                &w,
                json!({"path": "doc.md", "content": format!("version {i}")}),
            )
            .await,
        );
    }
    assert_eq!(
        std::fs::read_to_string(repo.join("doc.md")).unwrap(),
        "version 8"
    );
    let expected: Vec<String> = (3..=7).map(|i| format!("version {i}")).collect();
    assert_eq!(versions_of(&repo), vec![expected]);
    // A planted symlink in place of the ring is refused, not followed.
    let outside = scratch.worker_dir("outside");
    std::fs::rename(repo.join(".warren-versions"), repo.join("old-ring")).unwrap();
    symlink(&outside, repo.join(".warren-versions")).unwrap();
    assert_refused(
        &call(&w, json!({"path": "doc.md", "content": "version 9"})).await,
        &["version ring"],
    );
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
    assert_eq!(
        std::fs::read_to_string(repo.join("doc.md")).unwrap(),
        "version 8"
    );
}

#[tokio::test]
async fn readers_never_see_a_partial_file() {
    let scratch = Scratch::new();
    let repo = scratch.worker_dir("repo");
    let a = "a".repeat(200_000);
    let b = "b".repeat(100_000);
    worker_file(&repo.join("big.txt"), a.as_bytes());
    let w = spawn("fs_write", &[("/r", &repo, true)]);
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (stop, path, a, b) = (stop.clone(), repo.join("big.txt"), a.clone(), b.clone());
        std::thread::spawn(move || {
            let mut reads = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let seen = std::fs::read_to_string(&path).unwrap();
                assert!(
                    seen == a || seen == b,
                    "a reader saw a partial file of {} bytes",
                    seen.len()
                );
                reads += 1;
            }
            reads
        })
    };
    for i in 0..40 {
        let content = if i % 2 == 0 { &b } else { &a };
        assert_ok(&call(&w, json!({"path": "big.txt", "content": content})).await);
    }
    stop.store(true, Ordering::Relaxed);
    let reads = reader.join().expect("reader saw only whole files");
    assert!(reads > 0);
}

/// The control for the test above: the same reader does catch a file rewritten in place
/// (truncate + write), so its silence about fs_write means something.
#[test]
fn control_the_reader_catches_in_place_rewrites() {
    let scratch = Scratch::new();
    let repo = scratch.worker_dir("repo");
    let a = "a".repeat(200_000);
    let b = "b".repeat(100_000);
    let path = repo.join("big.txt");
    std::fs::write(&path, &a).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (stop, path, a, b) = (stop.clone(), path.clone(), a.clone(), b.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let seen = std::fs::read_to_string(&path).unwrap();
                if seen != a && seen != b {
                    return true;
                }
            }
            false
        })
    };
    for i in 0..20_000 {
        if reader.is_finished() {
            break;
        }
        std::fs::write(&path, if i % 2 == 0 { &b } else { &a }).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    assert!(
        reader.join().unwrap(),
        "in-place rewrites were never seen torn: the reader proves nothing"
    );
}

#[tokio::test]
async fn the_version_ring_keeps_within_its_quota_evicting_the_oldest() {
    let scratch = Scratch::new();
    let repo = scratch.worker_dir("repo");
    let w = spawn("fs_write", &[("/r", &repo, true)]);
    // Five 15 MiB files, each replaced once: 75 MiB of versions against a 64 MiB quota.
    let big = vec![b'a'; 15 << 20];
    for k in 0..5 {
        let path = format!("f{k}.txt");
        worker_file(&repo.join(&path), &big);
        assert_ok(&call(&w, json!({"path": path, "content": "small"})).await);
    }
    let ring = repo.join(".warren-versions");
    let mut total = 0;
    let mut kept = Vec::new();
    for entry in std::fs::read_dir(&ring).unwrap() {
        let dir = entry.unwrap().path();
        let label = std::fs::read_to_string(dir.join("path")).unwrap();
        for version in std::fs::read_dir(&dir).unwrap() {
            let version = version.unwrap();
            if version.file_name() != "path" {
                total += version.metadata().unwrap().len();
                kept.push(label.trim().to_string());
            }
        }
    }
    kept.sort();
    assert_eq!(
        kept,
        vec!["f1.txt", "f2.txt", "f3.txt", "f4.txt"],
        "f0.txt's version, the oldest, was evicted"
    );
    assert!(total <= 64 << 20, "{total} bytes of versions");
}

#[tokio::test]
async fn dotdot_in_a_write_path_stays_in_the_root() {
    let scratch = Scratch::new();
    let repo = scratch.worker_dir("repo");
    let outside = scratch.worker_dir("outside");
    worker_file(&outside.join("victim"), b"victim");
    let w = spawn("fs_write", &[("/r", &repo, true)]);
    // `..` stops at the root: `../outside` is `<root>/outside`, which does not exist.
    assert_refused(
        &call(&w, json!({"path": "../outside/victim", "content": "x"})).await,
        &["parent directory does not exist"],
    );
    assert_ok(
        &call(
            &w,
            json!({"path": "/r/../../outside/victim", "content": "inside", "create_dirs": true}),
        )
        .await,
    );
    assert_eq!(
        std::fs::read_to_string(outside.join("victim")).unwrap(),
        "victim"
    );
    assert_eq!(
        std::fs::read_to_string(repo.join("outside/victim")).unwrap(),
        "inside"
    );
    assert_refused(
        &call(&w, json!({"path": "..", "content": "x"})).await,
        &["names a directory"],
    );
}

#[tokio::test]
async fn content_beyond_sixteen_mebibytes_is_refused() {
    let scratch = Scratch::new();
    let repo = scratch.worker_dir("repo");
    let w = spawn("fs_write", &[("/r", &repo, true)]);
    let content = "z".repeat((16 << 20) + 1);
    assert_refused(
        &call(&w, json!({"path": "huge", "content": content})).await,
        &["at most 16777216 bytes"],
    );
    assert!(!repo.join("huge").exists());
}
