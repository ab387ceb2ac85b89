//! Limits bind a namespace's whole subtree: the namespaces it clones through its own `/ns` share
//! its `pids` (one uid, one RLIMIT_NPROC count) and end when it ends, `kill -9` of the `warren
//! run` that started it included.

mod common;

use common::{Warren, ns_ids, wait_until};

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
    let Some(w) = Warren::up() else {
        panic!("warren run needs root and /dev/fuse")
    };
    let spec = w.base.path().join("parent.ns");
    std::fs::write(&spec, format!("{SYSTEM}mount ns /ns\n")).unwrap();
    let child_spec = SYSTEM.replace('\n', "\\n");
    let script = format!(
        "exec 3<>/ns/clone; printf '{child_spec}' >&3; id=$(cat <&3); exec 3<&-; \
         echo 'run /bin/sleep 600' > /ns/$id/ctl; echo child $id; exec sleep 600"
    );
    let mut launcher = w
        .cmd(&[
            "run",
            "--ns",
            spec.to_str().unwrap(),
            "--",
            "/bin/sh",
            "-c",
            &script,
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
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
    let Some(w) = Warren::up() else {
        panic!("warren run needs root and /dev/fuse")
    };
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
    let mut launcher = w
        .cmd(&[
            "run",
            "--ns",
            spec.to_str().unwrap(),
            "--",
            "/usr/bin/python3",
            "/probe/fan.py",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
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
