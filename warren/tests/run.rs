//! `warren run` against the real daemons: a confined command whose /tool is a kernel FUSE mount
//! served by the bridge over a connection nsd-side code made and handed to toolfs with a grant.
//! Needs root, /dev/fuse and the workspace's binaries.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

struct Warren {
    base: tempfile::TempDir,
}

impl Warren {
    fn up() -> Option<Warren> {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: warren run needs root (namespaces, FUSE mounts, uid changes)");
            return None;
        }
        if !std::path::Path::new("/dev/fuse").exists() {
            eprintln!("skipped: no /dev/fuse (the kernel's FUSE device) on this host");
            return None;
        }
        let bin = PathBuf::from(env!("CARGO_BIN_EXE_warren"));
        for b in ["warren-toolfs", "warren-bridge", "warren-tool-worker"] {
            assert!(
                bin.with_file_name(b).exists(),
                "{b} missing: build the workspace first"
            );
        }
        let base = tempfile::Builder::new()
            .prefix("wrun")
            .tempdir_in("/tmp")
            .unwrap();
        let w = Warren { base };
        let out = w.run(&["up"]);
        assert!(
            out.status.success(),
            "warren up: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(w)
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_warren"));
        c.args(args)
            .env("WARREN_RUNTIME_DIR", self.base.path().join("run"))
            .env("WARREN_DATA_DIR", self.base.path().join("data"))
            .env("WARREN_SECRETS_DIR", self.base.path().join("secrets"))
            .stdin(std::process::Stdio::null());
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().unwrap()
    }

    /// `warren run FLAGS -- sh -c SCRIPT`, returning (status, stdout, stderr).
    fn sh(&self, flags: &[&str], script: &str) -> (i32, String, String) {
        let mut args = vec!["run"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["--", "/bin/sh", "-c", script]);
        let out = self.run(&args);
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

impl Drop for Warren {
    fn drop(&mut self) {
        let _ = self.run(&["down"]);
    }
}

/// N1: only granted tools exist; ungranted names and host paths are ENOENT, never EACCES.
#[test]
fn only_granted_tools_exist_inside() {
    let Some(w) = Warren::up() else { return };
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
    let Some(w) = Warren::up() else { return };
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
    let Some(w) = Warren::up() else { return };
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
    let Some(w) = Warren::up() else { return };
    let started = Instant::now();
    let (code, out, err) = w.sh(
        &["--tool", "echo"],
        r#"( exec 3<>/tool/echo/call; printf '{"delay_ms":8000}' >&3; cat <&3 >/tmp/slow ) &
           sleep 0.3
           cat /tool/tools | cut -f1
           i=0; while [ $i -lt 20 ]; do
             ( exec 5<>/tool/echo/call; printf '{"i":%d}' $i >&5; cat <&5 >/tmp/r$i ) & i=$((i+1)); done
           wait %2 2>/dev/null; sleep 0.1
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
    // The namespace ends with its command; the held call's reader died with it.
    assert!(started.elapsed() < Duration::from_secs(60));
}

/// Waits (bounded) for a pending ask to appear on the gate and returns (id, request text).
fn next_ask(w: &Warren, after: i64) -> (i64, String) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = w.run(&["ls", "/gate/pending"]);
        let ids: Vec<i64> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.trim_end_matches('/').parse().ok())
            .filter(|&id| id > after)
            .collect();
        if let Some(&id) = ids.iter().min() {
            let req = w.run(&["cat", &format!("/gate/pending/{id}/request")]);
            return (id, String::from_utf8_lossy(&req.stdout).into_owned());
        }
        assert!(Instant::now() < deadline, "no ask appeared on the gate");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn fingerprint(request: &str) -> &str {
    request
        .lines()
        .find_map(|l| l.strip_prefix("fingerprint "))
        .expect("the request shows a fingerprint")
        .trim()
}

/// N8 and the gate from inside, through FUSE: an exec-tier call blocks until the operator writes
/// `allow once <fp>` to the ask's ctl; the identical next call asks again; `deny` means the tool
/// never runs. Every decision and effect is a receipt of the session.
#[test]
fn exec_calls_wait_for_the_operator_from_inside() {
    let Some(w) = Warren::up() else { return };
    let work = tempfile::Builder::new()
        .prefix("wgate")
        .tempdir_in("/tmp")
        .unwrap();
    nix::unistd::chown(work.path(), Some(61010.into()), Some(61010.into())).unwrap();
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
    let agent = w
        .cmd(&[
            "run",
            "--ns",
            spec.to_str().unwrap(),
            "--",
            "/bin/sh",
            "-c",
            &script,
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
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
    let out = w.run(&[
        "write",
        &format!("/gate/pending/{first}/ctl"),
        &format!("allow once {fp}"),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The identical second call asks again; deny it.
    let (second, request2) = next_ask(&w, first);
    assert_eq!(
        fingerprint(&request2),
        fp,
        "the identical call has another fingerprint"
    );
    let out = w.run(&["write", &format!("/gate/pending/{second}/ctl"), "deny"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
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
