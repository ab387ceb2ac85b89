//! `warren run` against the real daemons: a confined command whose /tool is a kernel FUSE mount
//! served by the bridge over a connection nsd-side code made and handed to toolfs with a grant.
//! Needs root, /dev/fuse and the workspace's binaries.

mod common;

use common::{Warren, envelopes, fingerprint, next_ask, ns_ids, wait_until};

/// N1: only granted tools exist; ungranted names and host paths are ENOENT, never EACCES.
#[test]
fn only_granted_tools_exist_inside() {
    let w = Warren::up();
    let (code, out, err) = w.sh(&["--tool", "fs_read", "--tool", "echo"], "cat /tool/tools");
    assert_eq!(code, 0, "{err}");
    let names: Vec<&str> = out.lines().map(|l| l.split('\t').next().unwrap()).collect();
    assert_eq!(names, ["echo", "fs_read"], "tools listed: {out}");

    let (code, out, err) = w.sh(
        &["--tool", "fs_read", "--tool", "echo"],
        "ls /tool; for p in /tool/shell /tool/shell/call /tool/fs_write /etc/shadow /root /work; do \
           if stat \"$p\" >/dev/null 2>/tmp/e; then echo \"PRESENT $p\"; else echo \"$p: $(cat /tmp/e)\"; fi; done",
    );
    assert_eq!(code, 0, "{err}");
    let listing: Vec<&str> = out.lines().take_while(|l| !l.starts_with('/')).collect();
    assert_eq!(listing, ["echo", "fs_read", "tools"], "{out}");
    assert!(
        !out.contains("PRESENT"),
        "an ungranted name or host path exists inside:\n{out}"
    );
    for line in out.lines().filter(|l| l.starts_with('/')) {
        assert!(
            line.contains("No such file or directory"),
            "not ENOENT: {line}"
        );
    }
}

/// The call-file idioms through the kernel: bash/dash `exec 3<>` and Python's `r+b`.
#[test]
fn calls_work_through_fuse_from_inside() {
    let w = Warren::up();
    let (code, out, err) = w.sh(
        &["--tool", "echo"],
        r#"exec 3<>/tool/echo/call; printf '{"text":"dash"}' >&3; cat <&3; echo;
           python3 -c 'f=open("/tool/echo/call","r+b",buffering=0); f.write(b"{\"text\":\"py\"}"); print(f.read().decode())'"#,
    );
    assert_eq!(code, 0, "{err}");
    let lines: Vec<serde_json::Value> = out
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert_eq!(lines[0]["content"], r#"{"text":"dash"}"#);
    assert_eq!(lines[1]["content"], r#"{"text":"py"}"#);
    for l in &lines {
        assert_eq!(l["status"], "ok");
        assert_eq!(l["taint"], "untrusted");
    }
    // Nothing can be created on the mount.
    let (code, _, _) = w.sh(&["--tool", "echo"], "echo x > /tool/new || exit 9");
    assert_eq!(code, 9);
}

/// N4: a tool carries its own authority. The agent's view has no bind of the directory, so it
/// cannot read the file itself, but fs_read — running in its worker with the tool's root —
/// can, and only that root.
#[test]
fn a_tool_reads_with_its_own_authority_not_the_agents() {
    let w = Warren::up();
    let repo = tempfile::Builder::new()
        .prefix("wrepo")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::write(
        repo.path().join("notes.md"),
        "only the tool can read this\n",
    )
    .unwrap();
    // The worker runs unprivileged: let it read.
    nix::unistd::chown(repo.path(), Some(61010.into()), None).ok();
    std::fs::set_permissions(
        repo.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    std::fs::set_permissions(
        repo.path().join("notes.md"),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    let repo_path = repo.path().to_str().unwrap();
    let spec = w.base.path().join("reviewer.ns");
    std::fs::write(
        &spec,
        format!("# a reviewer\nmount tool /tool fs_read\ntool fs_read -r {repo_path}\n"),
    )
    .unwrap();
    let script = format!(
        r#"test -e {repo_path} && echo AGENT-SEES-REPO;
           exec 3<>/tool/fs_read/call; printf '{{"path":"{repo_path}/notes.md"}}' >&3; cat <&3; echo;
           exec 4<>/tool/fs_read/call; printf '{{"path":"/etc/hostname"}}' >&4; cat <&4; echo"#
    );
    let (code, out, err) = w.sh(&["--ns", spec.to_str().unwrap()], &script);
    assert_eq!(code, 0, "{err}");
    assert!(
        !out.contains("AGENT-SEES-REPO"),
        "the agent's own view contains the tool's root:\n{out}"
    );
    let mut lines = out.lines().filter(|l| l.starts_with('{'));
    let inside: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    assert_eq!(inside["status"], "ok", "{inside}");
    assert!(
        inside["content"]
            .as_str()
            .unwrap()
            .contains("only the tool can read this")
    );
    let outside: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    assert_ne!(
        outside["status"], "ok",
        "fs_read read outside its root: {outside}"
    );
}

/// The bridge answers asynchronously: a call held by the server does not block `cat tools` nor
/// other calls on the same mount.
#[test]
fn a_blocked_call_does_not_block_the_mount() {
    let w = Warren::up();
    let (code, out, err) = w.sh(
        &["--tool", "echo"],
        r#"( exec 3<>/tool/echo/call; printf '{"delay_ms":8000}' >&3; cat <&3 >/tmp/slow ) &
           sleep 0.3
           cat /tool/tools | cut -f1
           i=0; pids=; while [ $i -lt 20 ]; do
             ( exec 5<>/tool/echo/call; printf '{"i":%d}' $i >&5; cat <&5 >/tmp/r$i ) & pids="$pids $!"; i=$((i+1)); done
           wait $pids
           for f in /tmp/r*; do grep -c '"status":"ok"' $f; done | sort | uniq -c
           if test -s /tmp/slow; then echo SLOW-DONE-EARLY; fi"#,
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.lines().any(|l| l == "echo"),
        "cat /tool/tools did not answer: {out}"
    );
    assert!(
        out.contains("20 1"),
        "not all 20 calls answered while one was held: {out}"
    );
    assert!(
        !out.contains("SLOW-DONE-EARLY"),
        "the held call finished early: {out}"
    );
}

/// N8 and the gate from inside, through FUSE: an exec-tier call blocks until the operator writes
/// `allow once <fp>` to the ask's ctl; the identical next call asks again; `deny` means the tool
/// never runs. Every decision and effect is a receipt of the session.
#[test]
fn exec_calls_wait_for_the_operator_from_inside() {
    let w = Warren::up();
    let work = tempfile::Builder::new()
        .prefix("wgate")
        .tempdir_in("/tmp")
        .unwrap();
    common::open_to_shell_workers(work.path());
    let dir = work.path().to_str().unwrap();
    let spec = w.base.path().join("shell.ns");
    std::fs::write(
        &spec,
        format!("mount tool /tool shell\ntool shell -w {dir}\n"),
    )
    .unwrap();
    let script = format!(
        r#"call() {{ exec 3<>/tool/shell/call; printf '%s' "$1" >&3; cat <&3; exec 3<&-; echo; }}
           call '{{"command":"echo ran >> {dir}/log","cwd":"{dir}"}}'
           call '{{"command":"echo ran >> {dir}/log","cwd":"{dir}"}}'"#
    );
    let agent = w.spawn_run(&[
        "--asks",
        "operator",
        "--ns",
        spec.to_str().unwrap(),
        "--",
        "/bin/sh",
        "-c",
        &script,
    ]);
    // First ask: nothing has run while it waits; allow it once.
    let (first, request) = next_ask(&w, 0);
    assert!(
        request.contains("tool shell") && request.contains("tier exec"),
        "{request}"
    );
    assert!(
        !work.path().join("log").exists(),
        "the call ran before it was answered"
    );
    let fp = fingerprint(&request).to_string();
    w.run_ok(&[
        "write",
        &format!("/gate/pending/{first}/ctl"),
        &format!("allow once {fp}"),
    ]);
    // The identical second call asks again; deny it.
    let (second, request2) = next_ask(&w, first);
    assert_eq!(
        fingerprint(&request2),
        fp,
        "the identical call has another fingerprint"
    );
    w.run_ok(&["write", &format!("/gate/pending/{second}/ctl"), "deny"]);
    let out = agent.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let envelopes: Vec<serde_json::Value> = stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(envelopes.len(), 2, "{stdout}");
    assert_eq!(envelopes[0]["status"], "ok", "{stdout}");
    assert_eq!(envelopes[1]["status"], "denied", "{stdout}");
    let log = std::fs::read_to_string(work.path().join("log")).unwrap();
    assert_eq!(log, "ran\n", "the tool ran other than exactly once");
}

fn ppid_of(pid: i32) -> Option<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))?
        .trim()
        .parse()
        .ok()
}

/// The front door never builds a namespace (so never needs CAP_SYS_ADMIN): the namespace's
/// holder is nsd's child, not `warren run`'s; it is listed in /ns with its info while it runs;
/// and killing the launcher (SIGKILL: no chance to clean up) tears the namespace down.
#[test]
fn nsd_builds_warren_runs_namespace_and_it_dies_with_the_launcher() {
    let w = Warren::up();
    let mut launcher = w.spawn_sh(&["--asks", "operator", "--tool", "echo"], "sleep 600");
    let mut ids = Vec::new();
    wait_until("the namespace appears in /ns", || {
        ids = ns_ids(&w);
        !ids.is_empty()
    });
    assert_eq!(ids.len(), 1, "{ids:?}");
    // Listed from the moment nsd accepts the request; `holder` once the command has exec'd.
    let mut info = String::new();
    wait_until("the command starts", || {
        info = String::from_utf8_lossy(&w.run(&["cat", &format!("/ns/{}/info", ids[0])]).stdout)
            .into_owned();
        info.contains("\nholder ")
    });
    let field = |k: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("{k} ")))
            .unwrap_or_else(|| panic!("no {k} in info:\n{info}"))
            .to_string()
    };
    assert_eq!(field("launcher"), launcher.id().to_string(), "{info}");
    assert_eq!(field("argv"), "/bin/sh -c 'sleep 600'", "{info}");
    assert_eq!(field("tool"), "echo", "{info}");
    assert_eq!(field("mount"), "tool /tool", "{info}");
    let holder: i32 = field("holder").parse().unwrap();
    // nsd: the supervisor's warren-nsd child (its namespaces' processes run the same binary).
    let parent = ppid_of(holder).expect("the holder runs");
    let exe = std::fs::read_link(format!("/proc/{parent}/exe")).unwrap();
    assert_eq!(
        exe.file_name().and_then(|n| n.to_str()),
        Some("warren-nsd"),
        "the namespace's holder is the child of {}, not nsd",
        exe.display()
    );
    assert_eq!(
        ppid_of(parent),
        Some(w.supervisor_pid()),
        "not the supervisor's nsd"
    );
    assert_ne!(parent, launcher.id() as i32);

    launcher.kill().unwrap();
    launcher.wait().unwrap();
    wait_until("the namespace dies with its launcher", || {
        !std::path::Path::new(&format!("/proc/{holder}")).exists()
    });
    wait_until("it leaves /ns", || ns_ids(&w).is_empty());
}

/// An operator namespace (`warren sh`'s, through `warren_ns::launch` with `operator: true`):
/// `mount gate|receipts|ns` are the launcher's own connections to the operator sockets, so the
/// namespace sees the operator's /ns (listing itself) and /receipts. Without the flag the same
/// `mount receipts` is refused before anything runs.
#[test]
fn an_operator_namespace_mounts_the_operator_sockets() {
    use std::os::fd::AsFd;
    use warren_ns::launch::client::{LaunchOptions, launch};
    let w = Warren::up();
    let dirs = warren_daemon::Dirs {
        runtime: w.runtime(),
        data: w.base.path().join("data"),
        secrets: w.base.path().join("secrets"),
    };
    let text = "bind -r /usr /usr\nbind -r /bin /bin\nbind -r /lib /lib\nbind -r /lib64 /lib64\n\
                mount gate /n/gate\nmount receipts /n/receipts\nmount ns /n/ns\n";
    let spec = warren_ns::parse("<test>", text).unwrap();
    let t = tempfile::Builder::new()
        .prefix("wopn")
        .tempdir_in("/tmp")
        .unwrap();
    let out_path = t.path().join("out");
    let out = std::fs::File::create(&out_path).unwrap();
    let null = std::fs::File::open("/dev/null").unwrap();
    let argv: Vec<String> = ["/bin/sh", "-c", "ls /n/ns; ls /n/gate"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let opts = LaunchOptions {
        operator: true,
        ..LaunchOptions::default()
    };
    let launched = launch(
        &dirs,
        &spec,
        &argv,
        &opts,
        [null.as_fd(), out.as_fd(), out.as_fd()],
    )
    .unwrap();
    let id = launched.id.to_string();
    assert_eq!(launched.wait().unwrap(), 0);
    let listing = std::fs::read_to_string(&out_path).unwrap();
    let lines: Vec<&str> = listing.lines().collect();
    assert!(
        lines.contains(&"clone") && lines.contains(&id.as_str()),
        "the operator's /ns, listing this namespace, not seen:\n{listing}"
    );
    assert!(lines.contains(&"pending"), "{listing}");

    let refused = launch(
        &dirs,
        &spec,
        &argv,
        &LaunchOptions::default(),
        [null.as_fd(), out.as_fd(), out.as_fd()],
    );
    let err = refused
        .err()
        .expect("an ordinary namespace mounted the operator's sockets");
    assert!(
        err.to_string()
            .contains("only an operator namespace may mount it"),
        "{err}"
    );
}

/// `mount gate` in an ordinary namespace: nsd hands the gate a `namespace` connection for it,
/// so the namespace sees the gate's tree with no asks of its own descendants (it has none) —
/// and `mount receipts` is refused there before anything runs.
#[test]
fn an_ordinary_namespace_gets_its_own_gate_view_and_no_receipts() {
    let w = Warren::up();
    let spec = w.base.path().join("gate.ns");
    std::fs::write(&spec, "mount gate /n/gate\n").unwrap();
    let spec = spec.to_str().unwrap();
    let (code, out, err) = w.sh(
        &["--asks", "operator", "--ns", spec],
        "ls /n/gate; echo --; ls /n/gate/pending",
    );
    assert_eq!(code, 0, "{err}");
    let (top, pending) = out.split_once("--\n").unwrap();
    assert!(top.lines().any(|l| l == "pending"), "{out}");
    assert_eq!(
        pending, "",
        "a namespace saw asks that are not its descendants': {out}"
    );

    let receipts = w.base.path().join("receipts.ns");
    std::fs::write(&receipts, "mount receipts /n/receipts\n").unwrap();
    let (code, out, err) = w.sh(
        &["--asks", "operator", "--ns", receipts.to_str().unwrap()],
        "echo RAN",
    );
    assert_eq!(code, 125, "{out}{err}");
    assert!(!out.contains("RAN"));
    assert!(
        err.contains("only an operator namespace may mount it"),
        "{err}"
    );
}

/// busybox (`cat` reads with sendfile, `dd` with read) gets the answer of a call file and of
/// `/ns/clone` through `warren run`'s mounts, as coreutils does — never a silent empty read; and
/// `cat /ns/clone` (opened read-only) makes no namespace.
#[test]
fn busybox_reads_call_and_rpc_files_and_a_read_only_clone_makes_nothing() {
    let w = Warren::up();
    let spec = w.base.path().join("bb.ns");
    std::fs::write(&spec, "mount tool /tool echo\nmount ns /ns\n").unwrap();
    let script = r#"
        for reader in 'busybox cat' 'busybox dd bs=65536' 'cat'; do
          exec 3<>/tool/echo/call; printf '{"text":"hi"}' >&3; $reader <&3 2>/dev/null; echo; exec 3<&-
        done
        exec 3<>/ns/clone; printf 'mount tool /tool echo\n' >&3; echo "child $(busybox cat <&3)"; exec 3<&-
        cat /ns/clone >/dev/null 2>&1 && echo READ-ONLY-CLONE-READ
        echo "listed $(ls /ns | tr '\n' ' ')"
    "#;
    let (code, out, err) = w.sh(&["--ns", spec.to_str().unwrap()], script);
    assert_eq!(code, 0, "{err}");
    let envelopes = envelopes(&out);
    assert_eq!(envelopes.len(), 3, "one answer per reader:\n{out}");
    for e in &envelopes {
        assert_eq!(e["status"], "ok", "{out}");
        assert_eq!(e["content"], r#"{"text":"hi"}"#, "{out}");
    }
    let child = out
        .lines()
        .find_map(|l| l.strip_prefix("child "))
        .unwrap()
        .trim();
    assert!(
        child.parse::<u64>().is_ok(),
        "busybox cat of /ns/clone: {out}"
    );
    assert!(!out.contains("READ-ONLY-CLONE-READ"), "{out}");
    let listed = out.lines().find_map(|l| l.strip_prefix("listed ")).unwrap();
    let mut listed: Vec<&str> = listed.split_whitespace().collect();
    listed.sort();
    assert_eq!(
        listed,
        [child, "clone"],
        "a read-only open of clone left a namespace: {out}"
    );
}
