//! Tool workers built by nsd, seen from inside `warren run`: the agent holds no tool
//! authority (a directory granted to `fs_write` is not in its view unless it binds it), and the
//! symlink-swap race of toolfs's tools_race.rs runs through the whole path — the agent's FUSE mount, the bridge,
//! toolfs, the gate, receiptd and a confined worker nsd built — writing nothing outside the root.
//! Needs root, /dev/fuse and the workspace's binaries.

mod common;

use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use common::{Warren, approve_every_ask};
use warren_daemon::identity::Role;

/// The operator lets every fs_write call run without an ask (the race makes thousands).
fn allow_fs_write(w: &Warren) {
    let out = w.run(&["write", "/gate/rules", "allow fs_write"]);
    assert!(
        out.status.success(),
        "writing the rule: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_agent_does_not_see_a_dir_granted_to_fs_write_unless_it_binds_it() {
    let w = Warren::up();
    allow_fs_write(&w);
    let dir = tempfile::Builder::new()
        .prefix("wfsw")
        .tempdir_in("/tmp")
        .unwrap();
    let uid = Role::Worker.uid();
    nix::unistd::chown(dir.path(), Some(uid.into()), Some(uid.into())).unwrap();
    let path = dir.path().to_str().unwrap();
    let spec = w.base.path().join("writer.ns");
    std::fs::write(
        &spec,
        format!("mount tool /tool fs_write\ntool fs_write -w {path}\n"),
    )
    .unwrap();
    let script = format!(
        r#"test -e {path} && echo AGENT-SEES-DIR;
           exec 3<>/tool/fs_write/call; printf '{{"path":"{path}/out.txt","content":"via the tool\\n"}}' >&3; cat <&3; echo"#
    );
    let (code, out, err) = w.sh(&["--ns", spec.to_str().unwrap()], &script);
    assert_eq!(code, 0, "{err}");
    assert!(
        !out.contains("AGENT-SEES-DIR"),
        "the agent's view holds fs_write's root:\n{out}"
    );
    let envelope: serde_json::Value =
        serde_json::from_str(out.lines().find(|l| l.starts_with('{')).unwrap()).unwrap();
    assert_eq!(envelope["status"], "ok", "{envelope}");
    let written = dir.path().join("out.txt");
    assert_eq!(std::fs::read_to_string(&written).unwrap(), "via the tool\n");
    assert_eq!(
        std::fs::metadata(&written).unwrap().uid(),
        uid,
        "written by nsd's worker uid"
    );

    // Bound explicitly (read-only), the same directory is in the agent's view: the absence
    // above is the missing bind, not a broken test.
    std::fs::write(
        &spec,
        format!("mount tool /tool fs_write\ntool fs_write -w {path}\nbind -r {path} /granted\n"),
    )
    .unwrap();
    let (code, out, err) = w.sh(&["--ns", spec.to_str().unwrap()], "cat /granted/out.txt");
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "via the tool\n");
}

/// The README's spec as written (its `reviewer.ns`), with its repository a directory a
/// non-root user owns (0755, as a home directory's repository is): `fs_write` creates a file in
/// it, and the file belongs to that user — the worker writes as the owner of the directory it
/// was granted, not as a warren uid (which could not create a file there at all).
#[test]
fn the_readmes_fs_write_writes_into_a_users_directory_as_that_user() {
    const USER: u32 = 4242;
    let w = Warren::up();
    allow_fs_write(&w);
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let spec_text = readme
        .split("cat > reviewer.ns <<'NS'\n")
        .nth(1)
        .and_then(|rest| rest.split("\nNS\n").next())
        .expect("the README's reviewer.ns");
    let repo = tempfile::Builder::new()
        .prefix("wrepo")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(
        repo.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    nix::unistd::chown(repo.path(), Some(USER.into()), Some(USER.into())).unwrap();
    let path = repo.path().to_str().unwrap();
    let spec = w.base.path().join("reviewer.ns");
    std::fs::write(&spec, spec_text.replace("/home/me/repo", path) + "\n").unwrap();
    let script = format!(
        r#"exec 3<>/tool/fs_write/call; printf '{{"path":"{path}/notes.md","content":"reviewed\\n"}}' >&3; cat <&3; echo"#
    );
    let (code, out, err) = w.sh(&["--ns", spec.to_str().unwrap()], &script);
    assert_eq!(code, 0, "{err}");
    let envelope: serde_json::Value =
        serde_json::from_str(out.lines().find(|l| l.starts_with('{')).unwrap()).unwrap();
    assert_eq!(envelope["status"], "ok", "{envelope}");
    let written = repo.path().join("notes.md");
    assert_eq!(std::fs::read_to_string(&written).unwrap(), "reviewed\n");
    let meta = std::fs::metadata(&written).unwrap();
    assert_eq!(
        (meta.uid(), meta.gid()),
        (USER, USER),
        "owned by the directory's owner"
    );

    // The same directory owned by root (0755): never written as root; the worker uid is kept
    // out, and the refusal says which uid was refused and why.
    nix::unistd::chown(repo.path(), Some(0.into()), Some(0.into())).unwrap();
    let script = script.replace("notes.md", "root.md");
    let (code, out, err) = w.sh(&["--ns", spec.to_str().unwrap()], &script);
    assert_eq!(code, 0, "{err}");
    let envelope: serde_json::Value =
        serde_json::from_str(out.lines().find(|l| l.starts_with('{')).unwrap()).unwrap();
    assert_eq!(envelope["status"], "error", "{envelope}");
    let why = envelope["content"].as_str().unwrap();
    assert!(
        why.contains(&format!("this tool writes as uid {}", Role::Worker.uid())),
        "{why}"
    );
    assert!(!repo.path().join("root.md").exists());
}

/// Calls made from inside `warren run`. Each is an ask (after the first result the session is
/// `untrusted_context`, which turns write-tier rules into asks) answered by [`approve_every_ask`].
const CALLS: usize = 1_000;

/// The race through a confined worker from inside `warren run` (at
/// [`CALLS`] calls; the full 10,000 run through nsd-built workers directly in toolfs's
/// tools_race.rs).
#[test]
fn racing_fs_writes_from_inside_warren_run_never_land_outside_the_root() {
    let w = Warren::up();
    allow_fs_write(&w);
    let approver = approve_every_ask(&w);
    let base = tempfile::Builder::new()
        .prefix("wrace")
        .tempdir_in("/tmp")
        .unwrap();
    let uid = Role::Worker.uid();
    let outside = warren_test_support::race::make_outside(base.path(), uid);
    let root = warren_test_support::race::make_root(base.path(), &outside, uid);
    let root_path = root.to_str().unwrap().to_string();
    let spec = w.base.path().join("race.ns");
    std::fs::write(
        &spec,
        format!("mount tool /tool fs_write\ntool fs_write -w {root_path}\n"),
    )
    .unwrap();
    // The agent: CALLS whole calls, each one open of the call file (Python's `r+b` idiom),
    // alternating absolute and relative paths, counting the envelopes' statuses.
    let script = format!(
        r#"python3 - <<'EOF'
import json, collections
counts = collections.Counter()
first = {{}}
for i in range({CALLS}):
    k = i % {files}
    path = "{root_path}/d/e/f%d.txt" % k if i % 3 == 0 else "d/e/f%d.txt" % k
    args = json.dumps({{"path": path, "content": "call %d\n" % i, "create_dirs": i % 2 == 0}})
    with open("/tool/fs_write/call", "r+b", buffering=0) as f:
        f.write(args.encode())
        envelope = json.loads(f.read())
        counts[envelope["status"]] += 1
        first.setdefault(envelope["status"], envelope["content"][:300])
print(json.dumps(counts))
print(json.dumps(first))
EOF"#,
        files = warren_test_support::race::FILES,
    );
    let before = warren_test_support::race::snapshot(&outside);
    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicU64::new(0));
    let swapping = {
        let (root, outside, stop, swaps) =
            (root.clone(), outside.clone(), stop.clone(), swaps.clone());
        std::thread::spawn(move || warren_test_support::race::swapper(root, outside, stop, swaps))
    };
    let started = std::time::Instant::now();
    let (code, out, err) = w.sh(
        &["--asks", "operator", "--ns", spec.to_str().unwrap()],
        &script,
    );
    let elapsed = started.elapsed();
    drop(approver);
    stop.store(true, Ordering::Relaxed);
    swapping.join().unwrap();
    assert_eq!(code, 0, "{err}");
    let mut lines = out.lines();
    let counts: serde_json::Value = serde_json::from_str(lines.next().unwrap_or("")).unwrap();
    let first: serde_json::Value = serde_json::from_str(lines.next().unwrap_or("")).unwrap();
    let count = |k: &str| counts[k].as_u64().unwrap_or(0);
    println!(
        "{CALLS} fs_write calls from inside warren run in {elapsed:.1?}: {counts}; {} swaps; first of each: {first}",
        swaps.load(Ordering::Relaxed)
    );
    assert_eq!(
        count("ok") + count("error") + count("denied"),
        CALLS as u64,
        "{counts}"
    );
    assert!(count("ok") > 0, "no write succeeded: {counts}");
    assert!(
        swaps.load(Ordering::Relaxed) > 0,
        "the swapper never swapped"
    );
    warren_test_support::race::assert_untouched(&outside, &before);
}

/// Attack (write identity × narrowing): a namespace granted `fs_write -w R`, where R is
/// root's (so its own worker writes as nsd's worker uid), clones a child with `fs_write -w
/// R/victim`, a 0700 directory of another user. The child's worker takes the identity of the
/// narrowed root's owner, so the child writes, as that user, where its parent's worker is refused
/// (permission denied). A clone must never hold more authority than its parent: the child's
/// write must be refused too (or made as the parent's identity).
#[test]
fn a_clone_never_writes_as_the_owner_of_a_directory_its_parent_cannot_write() {
    const VICTIM: u32 = 4243;
    let w = Warren::up();
    allow_fs_write(&w);
    let t = tempfile::Builder::new()
        .prefix("wident")
        .tempdir_in("/tmp")
        .unwrap();
    let mode = |p: &std::path::Path, m: u32| {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(m)).unwrap()
    };
    let shared = t.path().join("shared");
    let victim = shared.join("victim");
    let out = t.path().join("out");
    for d in [&victim, &out] {
        std::fs::create_dir_all(d).unwrap();
    }
    mode(t.path(), 0o755);
    mode(&shared, 0o755);
    mode(&out, 0o777);
    mode(&victim, 0o700);
    nix::unistd::chown(victim.as_path(), Some(VICTIM.into()), Some(VICTIM.into())).unwrap();
    let (r, v) = (shared.to_str().unwrap(), victim.to_str().unwrap());
    let spec = w.base.path().join("parent.ns");
    std::fs::write(
        &spec,
        format!(
            "bind -r /usr /usr\nbind -r /bin /bin\nbind -r /lib /lib\nbind -r /lib64 /lib64\n\
             bind -w {} /out\nmount ns /ns\nmount tool /tool fs_write\ntool fs_write -w {r}\n",
            out.display()
        ),
    )
    .unwrap();
    // The child makes the first call of the subtree (so it is allowed by the rule, not asked);
    // then the parent tries the same directory itself (the control: permission denied).
    let script = format!(
        r#"cat > /out/child.sh <<'EOC'
exec 3<>/tool/fs_write/call; printf '{{"path":"{v}/pwned","content":"as the victim"}}' >&3; cat <&3 > /out/child.out; exec 3<&-
EOC
exec 3<>/ns/clone
printf 'bind -r /usr /usr\nbind -r /bin /bin\nbind -r /lib /lib\nbind -r /lib64 /lib64\nbind -w /out /out\nmount tool /tool fs_write\ntool fs_write -w {v}\n' >&3
id=$(cat <&3); exec 3<&-
echo "run /bin/sh /out/child.sh" > /ns/$id/ctl
cat /ns/$id/wait
exec 3<>/tool/fs_write/call; printf '{{"path":"{v}/parent","content":"p"}}' >&3; cat <&3; echo; exec 3<&-"#
    );
    let (code, stdout, err) = w.sh(&["--ns", spec.to_str().unwrap()], &script);
    assert_eq!(code, 0, "{err}");
    assert!(
        stdout.contains("permission denied"),
        "the control: the parent's own worker cannot write {v}: {stdout}"
    );
    assert!(!victim.join("parent").exists());
    let child = std::fs::read_to_string(out.join("child.out")).unwrap_or_default();
    let written = victim.join("pwned");
    let owner = std::fs::metadata(&written).ok().map(|m| m.uid());
    assert!(
        !written.exists(),
        "the clone wrote into another user's 0700 directory its parent cannot write, as uid \
         {owner:?}: {child}"
    );
}
