//! Narrowing from inside: a namespace started by a real `warren-nsd serve` with
//! `mount ns /ns` writes child specs to its own `/ns/clone` over the real bridge and 9P. Widening
//! children are refused whole; a narrower one is built by nsd from the parent's bind handles,
//! runs, and shows in both views with its own session.

mod common;

use std::os::fd::{AsFd, OwnedFd};

use common::*;
use warren_daemon::Dirs;
use warren_ns::launch::client::{LaunchOptions, Launched, launch};

const SYSTEM: &str =
    "bind -r /usr /usr\nbind -r /bin /bin\nbind -r /lib /lib\nbind -r /lib64 /lib64\n";

/// Runs the probe (`/probe/p.py` under `tree`) as a parent namespace with `data` at /data (its
/// `c` writable), the probe at /probe and `mount ns /ns`; asserts it exited 0 and returns what it
/// printed, with the parent's handle.
fn run_probe_parent(
    dirs: &Dirs,
    tree: &std::path::Path,
    data: &std::path::Path,
) -> (Launched, String) {
    let out_path = tree.join("out.txt");
    let stdout: OwnedFd = std::fs::File::create(&out_path).unwrap().into();
    let stdin: OwnedFd = std::fs::File::open("/dev/null").unwrap().into();
    let stderr: OwnedFd = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/null")
        .unwrap()
        .into();
    let text = format!(
        "{SYSTEM}bind -r {d} /data\nbind -w {d}/c /data/c\nbind -r {p} /probe\nmount ns /ns\n",
        d = data.display(),
        p = tree.join("probe").display()
    );
    let parent = launch(
        dirs,
        &warren_ns::parse("<test>", &text).unwrap(),
        &["/usr/bin/python3".to_string(), "/probe/p.py".to_string()],
        &LaunchOptions::default(),
        [stdin.as_fd(), stdout.as_fd(), stderr.as_fd()],
    )
    .unwrap();
    let code = parent.wait().unwrap();
    let out = std::fs::read_to_string(&out_path).unwrap();
    assert_eq!(code, 0, "parent failed:\n{out}");
    (parent, out)
}

/// The parent's payload: each `clone NAME SPEC` writes SPEC to its own /ns/clone and reads on
/// the same fd from where the write ended, printing `NAME <id>` or, when that read fails,
/// `NAME refused errno=N REASON` with the reason the next read answers (`one-line` if it is one
/// line); accepted children named `run-*` are started and waited for; then it prints its own
/// /ns listing, and finally does the same from a shell on one fd (`exec 3<>`), refused and
/// accepted.
const PROBE_PY: &str = r#"
import os, subprocess, sys
SYS = "bind -r /usr /usr\nbind -r /bin /bin\nbind -r /lib /lib\nbind -r /lib64 /lib64\n"
def clone(text):
    fd = os.open('/ns/clone', os.O_RDWR)
    try:
        os.write(fd, text.encode())
        try:
            return os.read(fd, 4096).decode().strip()
        except OSError as e:
            why = os.read(fd, 4096).decode()
            lines = 'one-line' if why.endswith('\n') and why.count('\n') == 1 else 'lines'
            return 'refused errno=%d %s %s' % (e.errno, lines, why.strip())
    finally:
        os.close(fd)
cases = [
    ('wide-write', 'bind -w /data/a /a\n'),
    ('wide-path', 'bind -r /etc /e\n'),
    ('wide-symlink-out', 'bind -r /data/out /o\n'),
    ('wide-symlink-in', 'bind -r /data/in /o\n'),
    ('wide-net', 'net loopback\n'),
    ('wide-gate', 'mount gate /gate\n'),
    ('wide-unix', 'mount unix!/run/x.sock /u\n'),
    ('wide-tcp', 'mount tcp!127.0.0.1!564 /t\n'),
    ('wide-key', 'mount -k k1 tcp!127.0.0.1!564 /t\n'),
    ('wide-dotdot', 'bind -r /data/../etc /e\n'),
    ('run-a', SYS + 'bind -r /data/a /a\nbind -w /data/c /c\nmount ns /ns\n'),
    ('run-b', SYS + 'bind -r /data/a /a\n'),
]
for name, text in cases:
    got = clone(text)
    print(name, got, flush=True)
    if name.startswith('run-') and not got.startswith('refused'):
        with open('/ns/%s/ctl' % got, 'w') as f:
            f.write("run /bin/sh -c 'cat /a/f > /c/made 2>/dev/null; exit 0'")
        with open('/ns/%s/wait' % got) as f:
            print(name + '-wait', f.read().strip(), flush=True)
print('listing', ' '.join(sorted(os.listdir('/ns'))), flush=True)
SH = 'exec 3<>/ns/clone; printf "%s" >&3; cat <&3; echo "first=$?"; cat <&3'
for name, text in [('sh-refused', 'bind -w /data/a /a\\n'), ('sh-run', 'bind -r /data/a /a\\n')]:
    got = subprocess.run(['/bin/sh', '-c', SH % text], stdout=subprocess.PIPE, text=True)
    print(name, got.stdout.strip().replace('\n', ' | '), flush=True)
"#;

/// The sample's payload: for each `NAME<TAB>SPEC` line (spec lines joined by `;`) of
/// /probe/specs, clone it from inside; start each accepted child with `find` over its targets
/// writing every (st_dev, st_ino) it can reach to /report/NAME; print `NAME <id>|refused…`.
const SAMPLE_PY: &str = r#"
import os
SYS = "bind -r /usr /usr\nbind -r /bin /bin\nbind -r /lib /lib\nbind -r /lib64 /lib64\nbind -w /data/c /report\n"
for line in open('/probe/specs'):
    name, text = line.rstrip('\n').split('\t')
    fd = os.open('/ns/clone', os.O_RDWR)
    try:
        os.write(fd, (SYS + text.replace(';', '\n') + '\n').encode())
        got = os.pread(fd, 64, 0).decode().strip()
    except OSError as e:
        got = 'refused errno=%d' % e.errno
    os.close(fd)
    print(name, got, flush=True)
    if not got.startswith('refused'):
        with open('/ns/%s/ctl' % got, 'w') as f:
            f.write("run /bin/sh -c 'find /t1 /t2 -printf \"%%D:%%i\\n\" > /report/%s 2>/dev/null; exit 0'" % name)
        with open('/ns/%s/wait' % got) as f:
            print(name + '-wait', f.read().strip(), flush=True)
"#;

/// A sample of random child specs (a fixed seed; the same alphabet as the property test in
/// `narrow.rs`: planted symlinks out and in, paths outside the parent's view, -w under -r, `..`
/// spellings the parser refuses) built for real: everything an accepted child can reach through
/// its binds, by (st_dev, st_ino) as seen inside, is inside the parent's own bind on the host.
#[test]
fn a_sample_of_random_children_built_for_real_reach_nothing_outside_the_parent() {
    need_root();
    let nsd = start_nsd("wnrw");
    let t = tempdir("wns");
    let d = t.path().join("data");
    for sub in ["a/b", "c"] {
        std::fs::create_dir_all(d.join(sub)).unwrap();
    }
    std::fs::create_dir_all(t.path().join("outside/deep")).unwrap();
    std::fs::write(d.join("a/b/f"), "x").unwrap();
    std::os::unix::fs::symlink(t.path().join("outside"), d.join("out")).unwrap();
    std::os::unix::fs::symlink(d.join("c"), d.join("a/in")).unwrap();
    std::fs::set_permissions(
        d.join("c"),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    std::fs::create_dir(t.path().join("probe")).unwrap();
    std::fs::write(t.path().join("probe/p.py"), SAMPLE_PY).unwrap();
    let paths = [
        "/data",
        "/data/a",
        "/data/a/b",
        "/data/c",
        "/data/a",
        "/data/c",
        "/data/out",
        "/data/a/in",
        "/data/a/b/f",
        "/data/../outside",
        "/outside",
        "/probe",
        "/x",
    ];
    let mut seed: u64 = 0x5eed_2026;
    let mut next = |n: usize| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((seed >> 33) as usize) % n
    };
    let mut lines = String::new();
    for i in 0..16 {
        let mut spec = Vec::new();
        for target in ["/t1", "/t2"] {
            if next(3) > 0 {
                let access = if next(4) > 0 { "-r" } else { "-w" };
                spec.push(format!(
                    "bind {access} {} {target}",
                    paths[next(paths.len())]
                ));
            }
        }
        if next(8) == 0 {
            spec.push("net loopback".into());
        }
        lines.push_str(&format!("s{i}\t{}\n", spec.join(";")));
    }
    std::fs::write(t.path().join("probe/specs"), &lines).unwrap();
    let (_parent, out) = run_probe_parent(&nsd.dirs, t.path(), &d);

    // Everything under the parent's binds of the test's tree on the host (its /data and
    // /probe), never following a symlink.
    let mut inside = std::collections::BTreeSet::new();
    let mut todo = vec![d.clone(), t.path().join("probe")];
    while let Some(p) = todo.pop() {
        let m = std::fs::symlink_metadata(&p).unwrap();
        inside.insert((
            std::os::unix::fs::MetadataExt::dev(&m),
            std::os::unix::fs::MetadataExt::ino(&m),
        ));
        if m.is_dir() {
            for e in std::fs::read_dir(&p).unwrap() {
                todo.push(e.unwrap().path());
            }
        }
    }
    let (mut built, mut refused) = (0, 0);
    for i in 0..16 {
        let name = format!("s{i}");
        let said = out
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name} in:\n{out}"));
        if said.starts_with("refused") {
            refused += 1;
            continue;
        }
        built += 1;
        let report = std::fs::read_to_string(d.join("c").join(&name)).unwrap();
        for l in report.lines() {
            let (dev, ino) = l.split_once(':').unwrap();
            let seen = (dev.parse::<u64>().unwrap(), ino.parse::<u64>().unwrap());
            assert!(
                inside.contains(&seen),
                "{name} reached {l} outside the parent:\n{lines}"
            );
        }
    }
    // The seed gives both kinds (a change of generator that loses one fails here, loudly).
    assert!(
        built >= 2 && refused >= 2,
        "built {built}, refused {refused}:\n{out}"
    );
}

/// Every widening the issue names is refused whole from inside; a narrower child is built by
/// nsd from the parent's bind handles and runs; each view shows what it should; every session
/// differs.
#[test]
fn narrowing_from_inside_a_namespace() {
    need_root();
    // nsd starts the bridge for the namespace's 9P mounts: it must be built.
    warren_test_support::bins::bin("warren-bridge");
    let nsd = start_nsd("wnrw");
    let t = tempdir("wnr");
    let d = t.path().join("data");
    std::fs::create_dir_all(d.join("a")).unwrap();
    std::fs::create_dir_all(d.join("c")).unwrap();
    std::fs::create_dir_all(t.path().join("outside")).unwrap();
    std::fs::write(d.join("a/f"), "from a\n").unwrap();
    std::os::unix::fs::symlink(t.path().join("outside"), d.join("out")).unwrap();
    std::os::unix::fs::symlink(d.join("c"), d.join("in")).unwrap();
    std::fs::set_permissions(
        d.join("c"),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    std::fs::create_dir(t.path().join("probe")).unwrap();
    std::fs::write(t.path().join("probe/p.py"), PROBE_PY).unwrap();
    let (parent, out) = run_probe_parent(&nsd.dirs, t.path(), &d);
    let said = |name: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no `{name}` in:\n{out}"))
            .to_string()
    };
    let eperm = format!("refused errno={}", libc::EPERM);
    let einval = format!("refused errno={}", libc::EINVAL);
    for name in [
        "wide-write",
        "wide-path",
        "wide-symlink-out",
        "wide-symlink-in",
        "wide-net",
        "wide-gate",
        "wide-unix",
        "wide-tcp",
        "wide-key",
    ] {
        assert!(said(name).starts_with(&eperm), "{name}:\n{out}");
    }
    // Each refusal reads back as one line naming what widened, in the child's words.
    let eperm_why = format!("{eperm} one-line error: refused: widens: ");
    for (name, what) in [
        (
            "wide-write",
            "bind `/data/a` asks -w where the parent has only -r",
        ),
        ("wide-path", "bind `/etc` is not under any of the parent's"),
        (
            "wide-symlink-out",
            "bind `/data/out` cannot be resolved: it goes through a symlink",
        ),
        (
            "wide-symlink-in",
            "bind `/data/in` cannot be resolved: it goes through a symlink",
        ),
        (
            "wide-net",
            "net Loopback is wider than the parent's net None",
        ),
        (
            "wide-gate",
            "mount of `gate` at /gate is not one of the parent's",
        ),
        (
            "wide-unix",
            "mount of `unix!/run/x.sock` at /u is not one of the parent's",
        ),
        (
            "wide-tcp",
            "mount of `tcp!127.0.0.1!564` at /t is not one of the parent's",
        ),
        (
            "wide-key",
            "mount of `tcp!127.0.0.1!564` at /t is not one of the parent's",
        ),
    ] {
        let got = said(name);
        let why = got
            .strip_prefix(&eperm_why)
            .unwrap_or_else(|| panic!("{name}: {got}"));
        assert!(why.contains(what), "{name}: {got}");
    }
    // `..` is refused by the parser already (and would be by the resolution; see narrow.rs).
    let dotdot = said("wide-dotdot");
    assert!(
        dotdot.starts_with(&format!("{einval} one-line error: invalid spec: line 1:")),
        "{out}"
    );
    // A shell on one fd: the first `cat` fails (EPERM), the second reads why; an accepted
    // clone answers its id to the read at the write's end (o₀).
    assert_eq!(
        said("sh-refused"),
        "first=1 | error: refused: widens: bind `/data/a` asks -w where the parent has only -r",
        "{out}"
    );
    let sh_run = said("sh-run");
    let (sh_id, rest) = sh_run.split_once(" | ").unwrap();
    assert!(sh_id.parse::<u64>().is_ok(), "{out}");
    assert_eq!(rest, "first=0", "{out}");

    let a: u64 = said("run-a").parse().unwrap();
    let b: u64 = said("run-b").parse().unwrap();
    assert_eq!(said("run-a-wait"), "exited 0");
    assert_eq!(said("run-b-wait"), "exited 0");
    // The child wrote through its -w bind, built from the parent's handle.
    assert_eq!(
        std::fs::read_to_string(d.join("c/made")).unwrap(),
        "from a\n"
    );
    // The parent's view: clone and its own children, nothing else (not itself).
    assert_eq!(said("listing"), format!("{a} {b} clone"));

    // The operator's view shows the children, with their parent and their own sessions.
    let listing = ns_read(&nsd.dirs, "").unwrap();
    for id in [a, b] {
        assert!(listing.lines().any(|l| l == id.to_string()), "{listing}");
    }
    let info_a = ns_read(&nsd.dirs, &format!("{a}/info")).unwrap();
    let info_b = ns_read(&nsd.dirs, &format!("{b}/info")).unwrap();
    assert_eq!(info_field(&info_a, "parent"), Some(parent.id.to_string()));
    assert_eq!(info_field(&info_a, "origin").as_deref(), Some("clone"));
    let sa = info_field(&info_a, "session").expect("child a's session");
    let sb = info_field(&info_b, "session").expect("child b's session");
    for s in [&sa, &sb, &parent.session] {
        assert_eq!(s.len(), 32, "{s}");
    }
    assert_ne!(sa, parent.session);
    assert_ne!(sb, parent.session);
    assert_ne!(sa, sb);
    // The child's spec reads in its own words (paths in the parent's view), never a handle.
    let spec_a = ns_read(&nsd.dirs, &format!("{a}/spec")).unwrap();
    assert!(spec_a.contains("/data/a /a"), "{spec_a}");
    assert!(!spec_a.contains("/proc/self/fd"), "{spec_a}");
}

/// The parent's payload for the moved nested bind: waits (a bounded poll) until `/data/b`
/// appears — the host renames `a`, where the parent has a nested `-r` bind, to `b` — then
/// clones a child asking `/data/b` `-w` and, if it is built, has it write there.
const MOVED_PY: &str = r#"
import os, time
SYS = "bind -r /usr /usr\nbind -r /bin /bin\nbind -r /lib /lib\nbind -r /lib64 /lib64\n"
for _ in range(200):
    if os.path.isdir('/data/b'):
        break
    time.sleep(0.05)
else:
    print('moved never-renamed', flush=True)
    raise SystemExit(0)
try:
    open('/data/b/parent', 'w').close()
    print('parent-write ok', flush=True)
except OSError as e:
    print('parent-write errno=%d' % e.errno, flush=True)
fd = os.open('/ns/clone', os.O_RDWR)
try:
    os.write(fd, (SYS + 'bind -w /data/b /b\n').encode())
    got = os.read(fd, 4096).decode().strip()
except OSError as e:
    got = 'refused errno=%d %s' % (e.errno, os.read(fd, 4096).decode().strip())
os.close(fd)
print('moved', got, flush=True)
if not got.startswith('refused'):
    with open('/ns/%s/ctl' % got, 'w') as f:
        f.write("run /bin/sh -c 'echo child > /b/written; exit 0'")
    with open('/ns/%s/wait' % got) as f:
        print('moved-wait', f.read().strip(), flush=True)
"#;

/// A nested `-r` bind's mount point renamed outside the namespace (by a tool worker or anyone
/// else with `-w` on the directory): the mount follows its dentry, so the parent's view still
/// shows the directory read-only, under its new name. A child asking `-w` on the new name must
/// be refused, though no parent bind's *target* lies beneath the asked path any more: nested
/// binds are found by their mount points' inodes, not their names (the counterexample the
/// formal model `warren-formal::narrowing` finds for `Bug::NestedByTargetName`).
#[test]
fn a_nested_read_bind_renamed_outside_stays_read_only_for_a_child() {
    need_root();
    warren_test_support::bins::bin("warren-bridge");
    let nsd = start_nsd("wnmv");
    let t = tempdir("wnm");
    let d = t.path().join("data");
    std::fs::create_dir_all(d.join("a")).unwrap();
    std::fs::write(d.join("a/f"), "read only\n").unwrap();
    std::fs::set_permissions(
        d.join("a"),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    std::fs::create_dir(t.path().join("probe")).unwrap();
    std::fs::write(t.path().join("probe/p.py"), MOVED_PY).unwrap();
    let out_path = t.path().join("out.txt");
    let stdout: OwnedFd = std::fs::File::create(&out_path).unwrap().into();
    let stdin: OwnedFd = std::fs::File::open("/dev/null").unwrap().into();
    let stderr: OwnedFd = std::fs::File::create(t.path().join("err.txt"))
        .unwrap()
        .into();
    let text = format!(
        "{SYSTEM}bind -w {d} /data\nbind -r {d}/a /data/a\nbind -r {p} /probe\nmount ns /ns\n",
        d = d.display(),
        p = t.path().join("probe").display()
    );
    let parent = launch(
        &nsd.dirs,
        &warren_ns::parse("<test>", &text).unwrap(),
        &["/usr/bin/python3".to_string(), "/probe/p.py".to_string()],
        &LaunchOptions::default(),
        [stdin.as_fd(), stdout.as_fd(), stderr.as_fd()],
    )
    .unwrap();
    // Outside the namespace, where `a` is no mount point: the rename is allowed.
    std::fs::rename(d.join("a"), d.join("b")).unwrap();
    let code = parent.wait().unwrap();
    let out = std::fs::read_to_string(&out_path).unwrap();
    let err = std::fs::read_to_string(t.path().join("err.txt")).unwrap();
    assert_eq!(code, 0, "parent failed:\n{out}\n{err}");
    let moved = out
        .lines()
        .find_map(|l| l.strip_prefix("moved "))
        .unwrap_or_else(|| panic!("no answer in:\n{out}\n{err}"))
        .to_string();
    // The parent's own view: the moved nested bind, read-only under its new name.
    assert!(
        out.contains(&format!("parent-write errno={}", libc::EROFS)),
        "{out}"
    );
    assert!(
        !d.join("b/written").exists(),
        "the child wrote where its parent can only read:\n{out}"
    );
    assert!(
        moved.starts_with(&format!("refused errno={}", libc::EPERM)),
        "{out}"
    );
    assert!(moved.contains("/data/b"), "{out}");
}
