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
    let w = Warren::up();
    w.run_ok(&["write", "/gate/rules", "allow fs_write"]);
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
    let parent = w.spawn_run(&[
        "--asks",
        "operator",
        "--ns",
        spec.to_str().unwrap(),
        "--",
        "/bin/sh",
        &format!("{s}/parent.sh"),
    ]);

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
        w.run_ok(&["write", &format!("/gate/pending/{id}/ctl"), "deny"]);
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

/// The flood: `python3 flood.py SYNC NAME THREADS` calls echo from THREADS threads until
/// SYNC/stop exists, marks SYNC/flooding-NAME at its first budget denial, and leaves its
/// outcomes (`ok`, or `denied:<basis>`) counted in SYNC/NAME.json.
const FLOOD_PY: &str = r#"
import os, sys, threading, json, collections
S, name, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
counts = collections.Counter()
lock = threading.Lock()
def call(i):
    fd = os.open("/tool/echo/call", os.O_RDWR)
    os.write(fd, b'{"i":%d}' % i)
    out = b""
    while True:
        c = os.read(fd, 65536)
        if not c:
            break
        out += c
    os.close(fd)
    e = json.loads(out)
    return "ok" if e["status"] == "ok" else "%s:%s" % (e["status"], e.get("basis") or e["content"])
def worker(k):
    i = 0
    while not os.path.exists(S + "/stop"):
        r = call(k * 10**7 + i)
        i += 1
        with lock:
            counts[r] += 1
        if r.startswith("denied:budget:") and not os.path.exists(S + "/flooding-" + name):
            open(S + "/flooding-" + name, "w").close()
ts = [threading.Thread(target=worker, args=(k,)) for k in range(n)]
for t in ts: t.start()
for t in ts: t.join()
with open(S + "/" + name + ".tmp", "w") as f:
    json.dump(counts, f)
os.rename(S + "/" + name + ".tmp", S + "/" + name + ".json")
"#;

/// The victim: N sequential echo calls; prints each envelope.
const CALLS_PY: &str = r#"
import os, sys
for i in range(int(sys.argv[1])):
    fd = os.open("/tool/echo/call", os.O_RDWR)
    os.write(fd, b'{"i":%d}' % i)
    out = b""
    while True:
        c = os.read(fd, 65536)
        if not c:
            break
        out += c
    os.close(fd)
    print(out.decode(), flush=True)
"#;

/// Unmounts a tmpfs when dropped (after the warren on it is down).
struct Tmpfs(std::path::PathBuf);

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        let _ = std::fs::remove_dir(&self.0);
        if let Some(base) = self.0.parent() {
            let _ = std::fs::remove_dir_all(base);
        }
    }
}

/// One namespace floods — 8 callers, and two clones of it with 4 callers each — on a small
/// tmpfs data dir, while a second namespace makes its calls: the second sees every call allowed
/// and receipted; the first (clones included: they count against it) is denied with its budget
/// basis; the data dir never reaches the free-space floor, and receiptd receipts the refusal.
#[test]
fn one_subtree_flooding_exhausts_only_its_own_budget() {
    const DATA_MB: u64 = 48;
    const FLOOR_MB: u64 = 8;
    const VICTIM_CALLS: usize = 300;
    assert!(
        nix::unistd::geteuid().is_root(),
        "needs root (namespaces, tmpfs)"
    );
    let base = tempfile::Builder::new()
        .prefix("wfl")
        .tempdir_in("/tmp")
        .unwrap();
    let data = base.path().join("data");
    std::fs::create_dir(&data).unwrap();
    nix::mount::mount(
        Some("tmpfs"),
        &data,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some(format!("size={DATA_MB}m,mode=0755").as_str()),
    )
    .unwrap();
    let _umount = Tmpfs(data.clone());
    let w = Warren { base };
    let up = w
        .cmd(&["up"])
        .env("WARREN_RECEIPTS_MIN_FREE_MB", FLOOR_MB.to_string())
        .env("WARREN_RECEIPTS_SUBTREE_MB", "4")
        .output()
        .unwrap();
    assert!(
        up.status.success(),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );

    let sync = tempfile::Builder::new()
        .prefix("wfs")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(sync.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let s = sync.path().to_str().unwrap();
    std::fs::write(sync.path().join("flood.py"), FLOOD_PY).unwrap();
    std::fs::write(sync.path().join("calls.py"), CALLS_PY).unwrap();
    let child_spec = format!("{SYSTEM}mount tool /tool echo\nbind -w {s} {s}\n");
    std::fs::write(
        sync.path().join("parent.sh"),
        format!(
            "{HELPERS}\nCHILD='{child_spec}'\n\
             for c in c1 c2; do id=$(clone \"$CHILD\"); echo \"run /usr/bin/python3 {s}/flood.py {s} $c 4\" > /ns/$id/ctl; done\n\
             python3 {s}/flood.py {s} parent 8\n\
             while [ ! -e {s}/c1.json ] || [ ! -e {s}/c2.json ]; do sleep 0.05; done\n"
        ),
    )
    .unwrap();
    let spec = w.base.path().join("flood.ns");
    std::fs::write(
        &spec,
        format!("{SYSTEM}mount tool /tool echo\nmount ns /ns\nbind -w {s} {s}\n"),
    )
    .unwrap();
    let flood = w.spawn_run(&[
        "--asks",
        "operator",
        "--ns",
        spec.to_str().unwrap(),
        "--",
        "/bin/sh",
        &format!("{s}/parent.sh"),
    ]);
    wait_until("the flood meets its budget", || {
        ["parent", "c1", "c2"]
            .iter()
            .all(|n| sync.path().join(format!("flooding-{n}")).exists())
    });

    // The victim, while the flood goes on.
    let (code, out, err) = w.sh(
        &["--tool", "echo", "--rw", s],
        &format!("python3 {s}/calls.py {VICTIM_CALLS}"),
    );
    std::fs::write(sync.path().join("stop"), "").unwrap();
    assert_eq!(code, 0, "{err}");
    let envelopes = common::envelopes(&out);
    assert_eq!(envelopes.len(), VICTIM_CALLS, "{out}");
    for e in &envelopes {
        assert_eq!(e["status"], "ok", "the victim's call: {e}");
    }
    let scope = envelopes[0]["receipt"]["scope"]
        .as_str()
        .unwrap()
        .to_owned();
    let kinds: Vec<String> = w
        .receipts(&scope)
        .iter()
        .map(|b| b["kind"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        kinds.iter().filter(|k| *k == "decision").count(),
        VICTIM_CALLS,
        "every call of the victim has its decision receipt"
    );
    wait_until("the victim's run receipts are written", || {
        w.receipts(&scope)
            .iter()
            .filter(|b| b["kind"] == "query")
            .count()
            == VICTIM_CALLS
    });

    let flooded = flood.wait_with_output().unwrap();
    assert!(
        flooded.status.success(),
        "{}",
        String::from_utf8_lossy(&flooded.stderr)
    );
    for name in ["parent", "c1", "c2"] {
        let counts: serde_json::Map<String, serde_json::Value> = serde_json::from_str(
            &std::fs::read_to_string(sync.path().join(format!("{name}.json"))).unwrap(),
        )
        .unwrap();
        let budget: u64 = counts
            .iter()
            .filter(|(k, _)| k.starts_with("denied:budget:receipt"))
            .map(|(_, v)| v.as_u64().unwrap())
            .sum();
        assert!(
            budget > 0,
            "{name} was never denied for its budget: {counts:?}"
        );
        for k in counts.keys() {
            assert!(
                k == "ok" || k.starts_with("denied:budget:receipt"),
                "{name}: an outcome other than ok or its budget: {counts:?}"
            );
        }
    }
    // The data dir never came near filling: above the floor, and no floor episode receipted.
    let st = nix::sys::statvfs::statvfs(&data).unwrap();
    let free = st.blocks_available() as u64 * st.fragment_size() as u64;
    assert!(free > FLOOR_MB << 20, "{free} bytes free in the data dir");
    let events: Vec<String> = w
        .receipts("receiptd")
        .iter()
        .filter_map(|b| b["subject"]["event"].as_str().map(str::to_owned))
        .collect();
    // One episode for the one flooding subtree, however often its calls were refused.
    assert_eq!(
        events.iter().filter(|e| *e == "budget_refused").count(),
        1,
        "{events:?}"
    );
    assert!(
        !events.iter().any(|e| e == "free_space_floor"),
        "{events:?}"
    );
}
