//! Limits bind a namespace's whole subtree and what it causes: the namespaces it clones through
//! its own `/ns` share its `pids` (one uid, one RLIMIT_NPROC count) and end when it ends, `kill
//! -9` of the `warren run` that started it included; its `shell` commands count against it, and
//! per-uid kernel objects of one namespace's commands are not another's.

mod common;

use common::{Warren, approve_every_ask, envelopes, ns_ids, wait_until};

const SYSTEM: &str =
    "bind -r /usr /usr\nbind -r /bin /bin\nbind -r /lib /lib\nbind -r /lib64 /lib64\n";

/// `/ns/<id>/<name>` as the operator reads it.
fn ns_file(w: &Warren, id: &str, name: &str) -> String {
    String::from_utf8_lossy(&w.run(&["cat", &format!("/ns/{id}/{name}")]).stdout).into_owned()
}

/// The holder's host pid while namespace `id` runs.
fn holder_of(w: &Warren, id: &str) -> Option<i32> {
    ns_file(w, id, "status")
        .trim()
        .strip_prefix("running holder=")?
        .parse()
        .ok()
        .filter(|&p| p != 0)
}

/// The ids of the namespaces namespace `parent` cloned.
fn children_of(w: &Warren, parent: &str) -> Vec<String> {
    ns_ids(w)
        .into_iter()
        .filter(|id| {
            ns_file(w, id, "info")
                .lines()
                .any(|l| l == format!("parent {parent}"))
        })
        .collect()
}

/// The ids of the namespaces made through a `/ns/clone`.
fn clone_ids(w: &Warren) -> Vec<String> {
    ns_ids(w)
        .into_iter()
        .filter(|id| ns_file(w, id, "info").lines().any(|l| l == "origin clone"))
        .collect()
}

/// (pid, ppid, real uid) of every host process.
fn processes() -> Vec<(i32, i32, u32)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        let field = |k: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .and_then(|v| v.split_whitespace().next()?.parse::<i64>().ok())
        };
        if let (Some(ppid), Some(uid)) = (field("PPid:"), field("Uid:")) {
            out.push((pid, ppid as i32, uid as u32));
        }
    }
    out
}

/// How many non-root host processes descend from one of `holders`.
fn payload_processes_under(holders: &[i32]) -> usize {
    let all = processes();
    let parent_of = |pid: i32| all.iter().find(|p| p.0 == pid).map(|p| p.1);
    all.iter()
        .filter(|(pid, _, uid)| {
            let mut at = Some(*pid);
            *uid != 0
                && std::iter::from_fn(|| {
                    let p = at?;
                    at = parent_of(p).filter(|&pp| pp > 1);
                    Some(p)
                })
                .any(|p| holders.contains(&p))
        })
        .count()
}

/// SIGKILL of the `warren run` whose namespace cloned a running child ends the child too: its
/// holder is gone and its status final.
#[test]
fn a_cloned_child_ends_with_its_launcher_killed() {
    let w = Warren::up();
    let spec = w.base.path().join("parent.ns");
    std::fs::write(&spec, format!("{SYSTEM}mount ns /ns\n")).unwrap();
    let child_spec = SYSTEM.replace('\n', "\\n");
    let script = format!(
        "exec 3<>/ns/clone; printf '{child_spec}' >&3; id=$(cat <&3); exec 3<&-; \
         echo 'run /bin/sleep 600' > /ns/$id/ctl; echo child $id; exec sleep 600"
    );
    let mut launcher = w.spawn_run(&[
        "--ns",
        spec.to_str().unwrap(),
        "--",
        "/bin/sh",
        "-c",
        &script,
    ]);
    let mut parent = String::new();
    wait_until("the parent runs", || {
        parent = ns_ids(&w).into_iter().next().unwrap_or_default();
        !parent.is_empty() && holder_of(&w, &parent).is_some()
    });
    let mut child = String::new();
    let mut child_holder = 0;
    wait_until("its clone runs", || {
        child = children_of(&w, &parent).pop().unwrap_or_default();
        child_holder = holder_of(&w, &child).unwrap_or(0);
        child_holder != 0
    });
    launcher.kill().unwrap();
    launcher.wait().unwrap();
    wait_until("the clone's holder is gone", || {
        !std::path::Path::new(&format!("/proc/{child_holder}")).exists()
    });
    let status = ns_file(&w, &child, "status");
    assert_eq!(status, "exited 137\n", "the clone was killed");
}

/// The clone fan-out: a `pids=16` parent starts 5 clones of 11 processes each. The subtree is
/// one uid with one RLIMIT_NPROC, so at most 16 of its processes ever live at once and at most
/// one clone gets all of its 11 (the old code ran 56: each clone had a uid, and a count, of its
/// own).
#[test]
fn clones_share_their_parents_pids() {
    let w = Warren::up();
    let probe = w.base.path().join("probe");
    let report = w.base.path().join("report");
    std::fs::create_dir(&probe).unwrap();
    std::fs::create_dir(&report).unwrap();
    std::fs::set_permissions(&report, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let child = format!("{SYSTEM}bind -w /c /c\nlimit pids=16\n");
    std::fs::write(
        probe.join("fan.py"),
        format!(
            r#"
import os, time
ids = []
for k in range(5):
    fd = os.open('/ns/clone', os.O_RDWR)
    os.write(fd, {child:?}.encode())
    ids.append(os.read(fd, 64).decode().strip())
    os.close(fd)
for k, i in enumerate(ids):
    try:
        with open('/ns/%s/ctl' % i, 'w') as f:
            f.write("run /bin/sh -c 'for n in 1 2 3 4 5 6 7 8 9 10; do sleep 600 & done; echo > /c/%d; wait'" % k)
    except OSError as e:
        pass
print('started', flush=True)
time.sleep(600)
"#
        ),
    )
    .unwrap();
    let spec = w.base.path().join("parent.ns");
    std::fs::write(
        &spec,
        format!(
            "{SYSTEM}bind -r {p} /probe\nbind -w {r} /c\nmount ns /ns\nlimit pids=16\n",
            p = probe.display(),
            r = report.display()
        ),
    )
    .unwrap();
    let mut launcher = w.spawn_run(&[
        "--ns",
        spec.to_str().unwrap(),
        "--",
        "/usr/bin/python3",
        "/probe/fan.py",
    ]);
    let mut parent = String::new();
    wait_until("the parent runs", || {
        parent = ns_ids(&w).into_iter().next().unwrap_or_default();
        !parent.is_empty() && holder_of(&w, &parent).is_some()
    });
    let mut children = Vec::new();
    wait_until("5 clones", || {
        children = children_of(&w, &parent);
        children.len() == 5
    });
    // Each clone has started all of its processes (and said so) or has ended (its fork or exec
    // refused, or killed).
    wait_until("every clone has forked what it could", || {
        children.iter().enumerate().all(|(k, id)| {
            report.join(k.to_string()).exists()
                || ns_file(&w, id, "status").starts_with("exited")
                || ns_file(&w, id, "status").starts_with("failed")
        })
    });
    let mut holders: Vec<i32> = children.iter().filter_map(|id| holder_of(&w, id)).collect();
    holders.extend(holder_of(&w, &parent));
    let live = payload_processes_under(&holders);
    let completed = (0..5)
        .filter(|k| report.join(k.to_string()).exists())
        .count();
    launcher.kill().unwrap();
    launcher.wait().unwrap();
    assert!(live <= 16, "{live} processes in a pids=16 subtree");
    assert!(
        completed <= 1,
        "{completed} clones started all 11 processes"
    );
}

/// The agent's script: one `shell` call per argument, each envelope on a line of its own.
const CALL_SHELL: &str = r#"for a in "$@"; do exec 3<>/tool/shell/call; printf '%s' "$a" >&3; cat <&3; exec 3<&-; echo; done"#;

/// A directory every uid may write: the shell worker of each namespace runs as a uid of its own.
fn shared_root(w: &Warren, name: &str, files: &[(&str, &str)]) -> std::path::PathBuf {
    let dir = w.base.path().join(name);
    std::fs::create_dir(&dir).unwrap();
    common::open_to_shell_workers(&dir);
    for (file, text) in files {
        std::fs::write(dir.join(file), text).unwrap();
    }
    dir
}

/// `warren run --asks operator --ns SPEC -- sh -c CALL_SHELL sh ARGS…`: the test's approver
/// answers the asks (a launcher with no terminal would deny them at once).
fn shell_calls(w: &Warren, spec: &std::path::Path, calls: &[&str]) -> std::process::Command {
    let mut args = vec![
        "run",
        "--asks",
        "operator",
        "--ns",
        spec.to_str().unwrap(),
        "--",
        "/bin/sh",
        "-c",
        CALL_SHELL,
    ];
    args.push("sh");
    args.extend(calls);
    w.cmd(&args)
}

/// One approved `shell` call under `limit pids=16 mem=64M` forks at most what the namespace has
/// (the old code: all 200) and cannot allocate 512 MiB (the old code: it did).
#[test]
fn a_shell_command_counts_against_its_namespaces_limits() {
    let w = Warren::up();
    let _approver = approve_every_ask(&w);
    let dir = shared_root(
        &w,
        "bomb",
        &[
            (
                "bomb.sh",
                "n=0; while [ $n -lt 200 ]; do sleep 30 & n=$((n+1)); echo forked $n; done\n",
            ),
            (
                "alloc.py",
                "b = bytearray(512 << 20)\nprint('allocated', len(b))\n",
            ),
        ],
    );
    let spec = w.base.path().join("bomb.ns");
    std::fs::write(
        &spec,
        format!(
            "mount tool /tool shell\ntool shell -w {}\nlimit pids=16 mem=64M\n",
            dir.display()
        ),
    )
    .unwrap();
    let out = shell_calls(
        &w,
        &spec,
        &[
            r#"{"command":"sh bomb.sh"}"#,
            r#"{"command":"python3 alloc.py"}"#,
        ],
    )
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let got = envelopes(&stdout);
    assert_eq!(
        got.len(),
        2,
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bomb = got[0]["content"].as_str().unwrap_or_default();
    let forked = bomb
        .lines()
        .filter_map(|l| l.strip_prefix("forked ")?.parse::<u32>().ok())
        .max()
        .unwrap_or(0);
    assert!(
        (1..16).contains(&forked),
        "{forked} processes forked under pids=16:\n{bomb}"
    );
    let alloc = got[1]["content"].as_str().unwrap_or_default();
    assert!(
        !alloc.contains("allocated") && alloc.contains("MemoryError"),
        "512 MiB under mem=64M:\n{alloc}"
    );
}

/// One namespace's approved command holds every inotify instance it can get (the kernel's per-uid
/// 128); another namespace's command can still make one, as its worker's uid is its own (the
/// old code: EMFILE, both ran as the one worker uid).
#[test]
fn one_namespaces_inotify_instances_are_not_anothers() {
    let w = Warren::up();
    let _approver = approve_every_ask(&w);
    let dir = shared_root(
        &w,
        "inotify",
        &[
            (
                "hold.py",
                "import ctypes, time\nlibc = ctypes.CDLL(None)\n\
                 fds = [libc.inotify_init() for _ in range(200)]\n\
                 open('held', 'w').write(str(sum(1 for f in fds if f >= 0)))\ntime.sleep(600)\n",
            ),
            (
                "one.py",
                "import ctypes\nprint('inotify_init', ctypes.CDLL(None).inotify_init())\n",
            ),
        ],
    );
    let spec = w.base.path().join("inotify.ns");
    std::fs::write(
        &spec,
        format!("mount tool /tool shell\ntool shell -w {}\n", dir.display()),
    )
    .unwrap();
    let mut holder = shell_calls(&w, &spec, &[r#"{"command":"python3 hold.py"}"#])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_until("the first namespace holds its instances", || {
        std::fs::read_to_string(dir.join("held")).is_ok_and(|n| !n.is_empty())
    });
    let held: u32 = std::fs::read_to_string(dir.join("held"))
        .unwrap()
        .parse()
        .unwrap();
    let out = shell_calls(&w, &spec, &[r#"{"command":"python3 one.py"}"#])
        .output()
        .unwrap();
    holder.kill().unwrap();
    holder.wait().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let got = envelopes(&stdout);
    assert_eq!(got.len(), 1, "{stdout}");
    let content = got[0]["content"].as_str().unwrap_or_default();
    let fd: i64 = content
        .lines()
        .find_map(|l| l.strip_prefix("inotify_init ")?.parse().ok())
        .unwrap_or_else(|| panic!("{content}"));
    assert!(held > 0, "the first namespace made no instance");
    assert!(
        fd >= 0,
        "the second namespace's inotify_init failed while the first held {held}:\n{content}"
    );
}

/// `clone_run SPEC SCRIPT`: clones SPEC (printf escapes) through this namespace's `/ns/clone`,
/// runs `/bin/sh SCRIPT` in it and prints its id.
const CLONE_SH: &str = r#"clone_run() {
    exec 3<>/ns/clone; printf "$1" >&3; id=$(cat <&3); exec 3<&-
    echo "run /bin/sh $2" > /ns/$id/ctl; echo $id
}
"#;

/// A probe dir (read-only at /probe in every namespace below) holding `files` and CLONE_SH.
fn probe_dir(w: &Warren, files: &[(&str, &str)]) -> std::path::PathBuf {
    let dir = w.base.path().join("probe");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("clone.sh"), CLONE_SH).unwrap();
    for (file, text) in files {
        std::fs::write(dir.join(file), text).unwrap();
    }
    dir
}

/// A spec as one printf format (its newlines as `\n`).
fn printf_spec(text: &str) -> String {
    text.replace('\n', "\\n")
}

/// The chain: the parent clones A, A clones B, and the parent's command then returns (exit 0):
/// `warren run` returns, and A and B end with it.
#[test]
fn a_clone_chain_ends_when_its_warren_run_returns() {
    let w = Warren::up();
    let report = shared_root(&w, "report", &[]);
    let child = printf_spec(&format!(
        "{SYSTEM}bind -r /probe /probe\nbind -w /c /c\nmount ns /ns\n"
    ));
    let parent_sh = format!(
        ". /probe/clone.sh; clone_run '{child}' /probe/a.sh; \
         while [ ! -e /c/b ]; do sleep 0.1; done; exit 0\n"
    );
    let a_sh = format!(". /probe/clone.sh; clone_run '{child}' /probe/b.sh; exec sleep 600\n");
    let probe = probe_dir(
        &w,
        &[
            ("parent.sh", &parent_sh),
            ("a.sh", &a_sh),
            ("b.sh", "echo > /c/b; exec sleep 600\n"),
        ],
    );
    let spec = w.base.path().join("parent.ns");
    std::fs::write(
        &spec,
        format!(
            "{SYSTEM}bind -r {} /probe\nbind -w {} /c\nmount ns /ns\n",
            probe.display(),
            report.display()
        ),
    )
    .unwrap();
    w.run_ok(&[
        "run",
        "--ns",
        spec.to_str().unwrap(),
        "--",
        "/bin/sh",
        "/probe/parent.sh",
    ]);
    assert!(report.join("b").exists(), "the grandchild never ran");
    let ids = clone_ids(&w);
    assert_eq!(ids.len(), 2, "the two clones are listed: {ids:?}");
    wait_until("the chain ends with its root", || {
        ids.iter().all(|id| holder_of(&w, id).is_none())
    });
    for id in &ids {
        assert_eq!(ns_file(&w, id, "status"), "exited 137\n", "namespace {id}");
    }
}

/// A clone waiting on an ask when the `warren run` of its parent is killed (SIGKILL): the clone
/// is killed, its ask leaves the pending list, and the call never runs.
#[test]
fn a_clones_open_ask_goes_with_its_killed_launcher() {
    let w = Warren::up();
    let root = shared_root(&w, "root", &[]);
    let tool = format!("mount tool /tool shell\ntool shell -w {}\n", root.display());
    let child = printf_spec(&format!("{SYSTEM}bind -r /probe /probe\n{tool}"));
    let parent_sh =
        format!(". /probe/clone.sh; clone_run '{child}' /probe/call.sh; exec sleep 600\n");
    let probe = probe_dir(
        &w,
        &[
            ("parent.sh", &parent_sh),
            (
                "call.sh",
                r#"exec 3<>/tool/shell/call; printf '%s' '{"command":"echo > ran"}' >&3; cat <&3"#,
            ),
        ],
    );
    let spec = w.base.path().join("parent.ns");
    std::fs::write(
        &spec,
        format!(
            "{SYSTEM}bind -r {} /probe\nmount ns /ns\n{tool}",
            probe.display()
        ),
    )
    .unwrap();
    let mut launcher = w.spawn_run(&[
        "--asks",
        "operator",
        "--ns",
        spec.to_str().unwrap(),
        "--",
        "/bin/sh",
        "/probe/parent.sh",
    ]);
    let (ask, request) = common::next_ask(&w, 0);
    assert!(request.contains("tool shell"), "{request}");
    let clone = clone_ids(&w).pop().expect("the clone is listed");
    launcher.kill().unwrap();
    launcher.wait().unwrap();
    wait_until("the clone ends", || holder_of(&w, &clone).is_none());
    wait_until("its ask leaves the pending list", || {
        let out = w.run(&["ls", "/gate/pending"]);
        !String::from_utf8_lossy(&out.stdout)
            .lines()
            .any(|l| l.trim_end_matches('/') == ask.to_string())
    });
    assert!(!root.join("ran").exists(), "the call ran");
}

/// Attack: SIGKILL of `warren run` ends its namespace, but not a `shell` call the namespace has
/// in flight. The command (`sleep 6; echo alive > after`, asking for a 60 s timeout of the
/// 600 s allowed) runs on as the subtree's uid after the holder is gone and writes into the
/// shell tool's root: what a namespace started outlives it by up to the call's timeout. A
/// subtree's end must end its calls' commands too.
#[test]
fn a_shell_command_in_flight_ends_with_its_launcher_killed() {
    let w = Warren::up();
    w.run_ok(&["write", "/gate/rules", "allow shell"]);
    let root = w.base.path().join("shroot");
    std::fs::create_dir(&root).unwrap();
    common::open_to_shell_workers(&root);
    let r = root.to_str().unwrap();
    let spec = w.base.path().join("sh.ns");
    std::fs::write(
        &spec,
        format!("{SYSTEM}mount tool /tool shell\ntool shell -w {r}\n"),
    )
    .unwrap();
    let script = format!(
        r#"exec 3<>/tool/shell/call; printf '{{"command":"echo started > started; sleep 6; echo alive > after","timeout_s":60,"cwd":"{r}"}}' >&3; cat <&3"#
    );
    let mut launcher = w.spawn_run(&[
        "--ns",
        spec.to_str().unwrap(),
        "--",
        "/bin/sh",
        "-c",
        &script,
    ]);
    let mut id = String::new();
    let mut holder = 0;
    wait_until("the namespace runs", || {
        id = ns_ids(&w).into_iter().next().unwrap_or_default();
        holder = holder_of(&w, &id).unwrap_or(0);
        holder != 0
    });
    wait_until("the shell command runs", || root.join("started").exists());
    launcher.kill().unwrap();
    launcher.wait().unwrap();
    wait_until("the holder is gone", || {
        !std::path::Path::new(&format!("/proc/{holder}")).exists()
    });
    std::thread::sleep(std::time::Duration::from_secs(10));
    assert!(
        !root.join("after").exists(),
        "the namespace's shell command ran on after its `warren run` was killed and its holder \
         was gone, and wrote {r}/after"
    );
}
