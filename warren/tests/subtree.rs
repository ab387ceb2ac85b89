//! A namespace's subtree through the real daemons: a namespace started by `warren run` clones
//! children through its own `/ns/clone`, and what nsd knows of who cloned whom (the lineage it
//! hands toolfs and the gate with each connection) decides how their calls are treated —
//! context follows the subtree, and an ask says who is asking.
//! Needs root, /dev/fuse and the workspace's binaries.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use common::{Warren, field};
use warren_daemon::identity::Role;

/// `call TOOL JSON` (one open is one call; prints the envelope) and `clone SPEC` (prints the
/// new namespace's id), for the scripts below.
const HELPERS: &str = r#"call() { exec 3<>"/tool/$1/call"; printf '%s' "$2" >&3; cat <&3; exec 3<&-; echo; }
clone() { exec 4<>/ns/clone; printf '%s' "$1" >&4; cat <&4; exec 4<&-; }"#;

/// As `common::next_ask`, or `None` after `limit`.
fn next_ask_within(w: &Warren, after: i64, limit: Duration) -> Option<(i64, String)> {
    let deadline = Instant::now() + limit;
    loop {
        let out = w.run(&["ls", "/gate/pending"]);
        let id = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.trim_end_matches('/').parse::<i64>().ok())
            .filter(|&id| id > after)
            .min();
        if let Some(id) = id {
            let req = w.run(&["cat", &format!("/gate/pending/{id}/request")]);
            return Some((id, String::from_utf8_lossy(&req.stdout).into_owned()));
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What a clone needs to run `/bin/sh` (a clone gets only what its spec binds).
const SYSTEM: &str =
    "bind -r /usr /usr\nbind -r /bin /bin\nbind -r /lib /lib\nbind -r /lib64 /lib64\n";

fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A tainted parent's clones are as tight as it is, whether cloned before or after it was
/// tainted: with `allow fs_write` as rule 1, the parent's first write is allowed and taints it
/// (a tool's result), its second asks (`context:untrusted_context`) — and so does every write of
/// its clones: child `a` (cloned and started before the taint, calling after it) and child `b`
/// (cloned after). Each child's ask names it, its command, the parent that cloned it and the
/// subtree (the parent's session).
#[test]
fn context_follows_the_subtree_and_asks_say_who_is_asking() {
    let Some(w) = Warren::up() else {
        panic!("warren up needs root and /dev/fuse")
    };
    let rule = w.run(&["write", "/gate/rules", "allow fs_write"]);
    assert!(
        rule.status.success(),
        "{}",
        String::from_utf8_lossy(&rule.stderr)
    );
    let work = tempfile::Builder::new()
        .prefix("wsw")
        .tempdir_in("/tmp")
        .unwrap();
    let worker = Role::Worker.uid();
    nix::unistd::chown(work.path(), Some(worker.into()), Some(worker.into())).unwrap();
    let sync = tempfile::Builder::new()
        .prefix("wss")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(sync.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let (wd, s) = (work.path().to_str().unwrap(), sync.path().to_str().unwrap());

    // A child writes one file through fs_write (child `a` first waits for the parent's taint)
    // and leaves its envelope in the sync dir.
    std::fs::write(
        sync.path().join("child.sh"),
        format!(
            "{HELPERS}\n[ \"$1\" = a ] && while [ ! -e {s}/go ]; do sleep 0.05; done\n\
             call fs_write \"$(printf '{{\"content\":\"x\",\"path\":\"{wd}/%s\"}}' \"$1\")\" > {s}/$1.tmp\n\
             mv {s}/$1.tmp {s}/$1.out\n"
        ),
    )
    .unwrap();
    let child_spec =
        format!("{SYSTEM}mount tool /tool fs_write\ntool fs_write -w {wd}\nbind -w {s} {s}\n");
    let parent_script = format!(
        "{HELPERS}\nCHILD='{child_spec}'\n\
         a=$(clone \"$CHILD\"); echo \"run /bin/sh {s}/child.sh a\" > /ns/$a/ctl\n\
         call fs_write '{{\"content\":\"p\",\"path\":\"{wd}/p1\"}}' > {s}/p1.out\n\
         touch {s}/go\n\
         call fs_write '{{\"content\":\"p\",\"path\":\"{wd}/p2\"}}' > {s}/p2.out &\n\
         b=$(clone \"$CHILD\"); echo \"run /bin/sh {s}/child.sh b\" > /ns/$b/ctl\n\
         echo \"children $a $b\" > {s}/ids\n\
         while [ ! -e {s}/a.out ] || [ ! -e {s}/b.out ]; do sleep 0.05; done; wait\n"
    );
    std::fs::write(sync.path().join("parent.sh"), parent_script).unwrap();
    let spec = w.base.path().join("parent.ns");
    std::fs::write(
        &spec,
        format!(
            "{SYSTEM}mount tool /tool fs_write\ntool fs_write -w {wd}\nmount ns /ns\nbind -w {s} {s}\n"
        ),
    )
    .unwrap();
    let parent = w
        .cmd(&[
            "run",
            "--asks",
            "operator",
            "--ns",
            spec.to_str().unwrap(),
            "--",
            "/bin/sh",
            &format!("{s}/parent.sh"),
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();

    // Three asks: the parent's second write, and one write from each child. Each is denied.
    let mut asks = Vec::new();
    let mut after = 0;
    for _ in 0..3 {
        let dump = || {
            let mut out = String::new();
            for e in std::fs::read_dir(sync.path()).unwrap().flatten() {
                let text = std::fs::read_to_string(e.path()).unwrap_or_default();
                out.push_str(&format!("{}: {}\n", e.file_name().to_string_lossy(), text));
            }
            for id in 1..4 {
                for f in ["status", "info"] {
                    let o = w.run(&["cat", &format!("/ns/{id}/{f}")]);
                    out.push_str(&format!(
                        "/ns/{id}/{f}: {}\n",
                        String::from_utf8_lossy(&o.stdout)
                    ));
                }
            }
            out
        };
        let Some((id, request)) = next_ask_within(&w, after, Duration::from_secs(30)) else {
            panic!(
                "ask {} of 3 did not appear; sync dir:\n{}",
                asks.len() + 1,
                dump()
            )
        };
        after = id;
        assert_eq!(field(&request, "tool"), "fs_write", "{request}");
        assert_eq!(field(&request, "context"), "untrusted_context", "{request}");
        asks.push(request);
        let denied = w.run(&["write", &format!("/gate/pending/{id}/ctl"), "deny"]);
        assert!(
            denied.status.success(),
            "{}",
            String::from_utf8_lossy(&denied.stderr)
        );
    }
    let out = parent.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let ids = std::fs::read_to_string(sync.path().join("ids")).unwrap();
    let ids: Vec<&str> = ids.split_whitespace().skip(1).collect();

    let (parents_asks, child_asks): (Vec<&String>, Vec<&String>) =
        asks.iter().partition(|r| field(r, "parents") == "-");
    assert_eq!(parents_asks.len(), 1, "{asks:#?}");
    let parent_ask = parents_asks[0];
    let parent_session = field(parent_ask, "session");
    let parent_ns = field(parent_ask, "namespace");
    assert_eq!(field(parent_ask, "subtree"), parent_session);
    assert!(
        field(parent_ask, "command").contains("parent.sh"),
        "{parent_ask}"
    );
    let mut seen_children: Vec<&str> = Vec::new();
    for r in child_asks {
        assert_eq!(field(r, "subtree"), parent_session, "{r}");
        assert_ne!(field(r, "session"), parent_session, "{r}");
        assert!(
            field(r, "parents").starts_with(&format!("{parent_ns} (")),
            "the parent chain names the parent: {r}"
        );
        assert!(field(r, "parents").contains("parent.sh"), "{r}");
        assert!(field(r, "command").contains("child.sh"), "{r}");
        assert!(
            field(r, "subtree_open_asks").parse::<u32>().unwrap() >= 1,
            "{r}"
        );
        seen_children.push(field(r, "namespace"));
    }
    seen_children.sort();
    let mut want: Vec<&str> = ids.clone();
    want.sort();
    assert_eq!(seen_children, want, "{asks:#?}");

    // What ran: the parent's first write only.
    wait_until("the children's envelopes", || {
        sync.path().join("a.out").exists() && sync.path().join("b.out").exists()
    });
    for child in ["a", "b"] {
        let env = std::fs::read_to_string(sync.path().join(format!("{child}.out"))).unwrap();
        assert!(
            env.contains("\"status\":\"denied\""),
            "child {child}: {env}"
        );
        assert!(
            !work.path().join(child).exists(),
            "child {child}'s write ran"
        );
    }
    assert!(work.path().join("p1").exists());
    assert!(!work.path().join("p2").exists());
}
