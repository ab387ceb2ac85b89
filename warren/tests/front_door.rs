//! The front door against the real daemons: `warren up`, the operator sockets, supervision and
//! `warren down`. Needs root (the supervisor changes uids) and the workspace's daemon binaries.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

struct Warren {
    base: tempfile::TempDir,
}

impl Warren {
    fn new() -> Warren {
        assert!(
            nix::unistd::geteuid().is_root(),
            "warren up needs root (it starts daemons under their own uids): scripts/test runs as root"
        );
        warren_test_support::bins::bin("warren-toolfs");
        let base = tempfile::Builder::new()
            .prefix("wfd")
            .tempdir_in("/tmp")
            .unwrap();
        Warren { base }
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_warren"));
        c.args(args)
            .env("WARREN_RUNTIME_DIR", self.base.path().join("run"))
            .env("WARREN_DATA_DIR", self.base.path().join("data"))
            .env("WARREN_SECRETS_DIR", self.base.path().join("secrets"));
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "warren {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn runtime(&self) -> PathBuf {
        self.base.path().join("run")
    }
}

impl Drop for Warren {
    fn drop(&mut self) {
        let _ = self.run(&["down", "--force"]);
    }
}

fn daemon_pid(runtime: &Path, binary: &str) -> Option<i32> {
    // The daemon whose environment names this runtime dir.
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(exe) = std::fs::read_link(format!("/proc/{pid}/exe")) else {
            continue;
        };
        if exe.file_name().and_then(|n| n.to_str()) != Some(binary) {
            continue;
        }
        let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let want = format!("WARREN_RUNTIME_DIR={}", runtime.display());
        if env.split(|&b| b == 0).any(|kv| kv == want.as_bytes()) {
            return Some(pid);
        }
    }
    None
}

fn status_field(pid: i32, field: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .map(|v| v.trim().to_string())
        .unwrap_or_default()
}

/// T: O2 (each daemon under its own uid), N9/H3 (non-dumpable, no root), the operator's view.
#[test]
fn up_serves_tools_under_the_daemons_own_uid_and_down_stops_them() {
    let w = Warren::new();
    let said = w.ok(&["up"]);
    assert!(said.contains("warren is up"), "{said}");
    // A second `up` finds the lock held and starts nothing.
    assert!(w.ok(&["up"]).contains("already up"));
    assert!(w.ok(&["status"]).contains("answers"));

    let pid = daemon_pid(&w.runtime(), "warren-toolfs").expect("toolfs is running");
    let uid = status_field(pid, "Uid:");
    assert!(
        !uid.split_whitespace().any(|u| u == "0"),
        "toolfs runs with uid 0: {uid}"
    );
    assert_eq!(status_field(pid, "NoNewPrivs:"), "1");
    // Exactly the operator group (to reach the other daemons' sockets), none of the supervisor's.
    let operators = nix::unistd::Group::from_name("warren")
        .unwrap()
        .expect("`up` made the warren group");
    assert_eq!(status_field(pid, "Groups:"), operators.gid.to_string());
    assert_eq!(
        status_field(pid, "CapBnd:"),
        status_field(pid, "CapPrm:"),
        "bounding set wider than kept caps"
    );
    // Non-dumpable: /proc/<pid>/environ etc. become root-owned, which is how the kernel shows it.
    let meta = std::fs::metadata(format!("/proc/{pid}/environ")).unwrap();
    assert_eq!(
        std::os::unix::fs::MetadataExt::uid(&meta),
        0,
        "toolfs is dumpable"
    );

    let listing = w.ok(&["ls", "/tool"]);
    for name in ["echo/", "tools"] {
        assert!(
            listing.lines().any(|l| l == name),
            "{name} missing from {listing}"
        );
    }
    let tools = w.ok(&["cat", "/tool/tools"]);
    assert!(
        tools.lines().any(|l| l.starts_with("echo\tread\t")),
        "{tools}"
    );
    let envelope = w.ok(&["call", "echo", r#"{"b":2,"a":1}"#]);
    let v: serde_json::Value = serde_json::from_str(&envelope).unwrap();
    assert_eq!(v["status"], "ok");
    // The arguments came back canonicalised (RFC 8785: sorted keys).
    assert_eq!(v["content"], r#"{"a":1,"b":2}"#);

    assert!(w.ok(&["down"]).contains("warren is down"));
    assert!(
        daemon_pid(&w.runtime(), "warren-toolfs").is_none(),
        "toolfs outlived warren down"
    );
    assert!(
        !w.runtime().join("tool.sock").exists(),
        "socket left behind"
    );
    assert!(!w.run(&["status"]).status.success());
}

/// Supervision: a daemon killed with SIGKILL comes back on the same socket.
#[test]
fn a_killed_daemon_is_restarted_on_the_same_socket() {
    let w = Warren::new();
    w.ok(&["up"]);
    let first = daemon_pid(&w.runtime(), "warren-toolfs").unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(first), nix::sys::signal::SIGKILL).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let second = loop {
        match daemon_pid(&w.runtime(), "warren-toolfs") {
            Some(p) if p != first => break p,
            _ if Instant::now() > deadline => panic!("toolfs was not restarted"),
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    assert_ne!(first, second);
    let envelope = w.ok(&["call", "echo", r#"{"x":"after restart"}"#]);
    assert!(envelope.contains("after restart"), "{envelope}");
}

/// H1: a host process that is not the operator cannot attach, even with the socket's path.
#[test]
fn a_non_operator_and_a_peer_in_another_pid_namespace_are_refused() {
    let w = Warren::new();
    w.ok(&["up"]);
    // Control: the operator gets in.
    w.ok(&["cat", "/tool/tools"]);

    // uid 65534 (nobody) with the runtime dir opened up so only the daemon's own check stands.
    let run = w.runtime();
    std::fs::set_permissions(&run, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::set_permissions(
        run.join("tool.sock"),
        std::os::unix::fs::PermissionsExt::from_mode(0o666),
    )
    .unwrap();
    let mut nobody = w.cmd(&["cat", "/tool/tools"]);
    std::os::unix::process::CommandExt::uid(&mut nobody, 65534);
    std::os::unix::process::CommandExt::gid(&mut nobody, 65534);
    let out = nobody.output().unwrap();
    assert!(
        !out.status.success(),
        "uid 65534 read /tool/tools: {}",
        String::from_utf8_lossy(&out.stdout)
    );

    // Root, but in a new pid namespace.
    let warren = env!("CARGO_BIN_EXE_warren");
    let out = Command::new("unshare")
        .args(["-p", "-f", "--", warren, "cat", "/tool/tools"])
        .env("WARREN_RUNTIME_DIR", w.runtime())
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "a root process in another pid namespace attached: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// `warren doctor` reports every kernel feature warren relies on, by name, as JSON a script can read.
#[test]
fn doctor_names_every_feature() {
    let out = Command::new(env!("CARGO_BIN_EXE_warren"))
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("doctor --json prints JSON");
    let names: Vec<&str> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    for want in [
        "namespaces",
        "landlock",
        "seccomp",
        "fuse",
        "v9fs",
        "cgroup v2",
        "apparmor userns",
    ] {
        assert!(
            names.contains(&want),
            "doctor does not report {want}: {names:?}"
        );
    }
    // Its exit status agrees with its verdict.
    assert_eq!(out.status.success(), v["ready"].as_bool().unwrap());
}

/// N7: what `warren up` writes verifies offline through the front door, and a changed byte does
/// not; a missing file is a usage error.
#[test]
fn receipts_export_and_verify_through_the_front_door() {
    let w = Warren::new();
    w.ok(&["up"]);
    // The boot receipt is signed one by one; a checkpoint makes the export cover it.
    w.ok(&["write", "/receipts/ctl", "checkpoint"]);
    let export = w.ok(&["receipts", "export", "receiptd"]);
    assert!(!export.is_empty());
    let keys = w.ok(&["receipts", "keys"]);
    let dir = tempfile::tempdir().unwrap();
    let (e, k) = (dir.path().join("export"), dir.path().join("keys"));
    std::fs::write(&e, &export).unwrap();
    std::fs::write(&k, &keys).unwrap();
    let verify = |file: &Path| {
        w.run(&[
            "verify",
            file.to_str().unwrap(),
            "--keys",
            k.to_str().unwrap(),
        ])
    };
    assert_eq!(
        verify(&e).status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&verify(&e).stderr)
    );
    // Entries land after the export (a rotation's receipt, then a checkpoint over it): the old
    // export still verifies alone, but not against the newer head read from the tree (exit 3,
    // incomplete); a fresh export does.
    w.ok(&["write", "/receipts/ctl", "rotate"]);
    w.ok(&["write", "/receipts/ctl", "checkpoint"]);
    let head = dir.path().join("head");
    std::fs::write(&head, w.ok(&["cat", "/receipts/receiptd/head"])).unwrap();
    std::fs::write(&k, w.ok(&["receipts", "keys"])).unwrap();
    let fresh = dir.path().join("fresh");
    std::fs::write(&fresh, w.ok(&["receipts", "export", "receiptd"])).unwrap();
    let verify_head = |file: &Path| {
        w.run(&[
            "verify",
            file.to_str().unwrap(),
            "--keys",
            k.to_str().unwrap(),
            "--head",
            head.to_str().unwrap(),
        ])
    };
    let stale = verify_head(&e);
    let said = String::from_utf8_lossy(&stale.stderr);
    assert_eq!(stale.status.code(), Some(3), "{said}");
    assert!(said.contains("not in this export"), "{said}");
    let plain = verify(&e);
    let said = String::from_utf8_lossy(&plain.stderr);
    assert_eq!(plain.status.code(), Some(0), "{said}");
    assert!(
        said.contains("says nothing about entries after it"),
        "{said}"
    );
    let full = verify_head(&fresh);
    let said = String::from_utf8_lossy(&full.stderr);
    assert_eq!(full.status.code(), Some(0), "{said}");
    assert!(
        said.contains("complete up to the checkpoint given with --head"),
        "{said}"
    );

    let mut tampered = export.into_bytes();
    let i = tampered.iter().position(|&b| b == b'"').unwrap() + 1;
    tampered[i] ^= 1;
    std::fs::write(&e, &tampered).unwrap();
    assert_eq!(verify(&e).status.code(), Some(1));
    assert_eq!(verify(&dir.path().join("absent")).status.code(), Some(2));
}

/// The README's quick start: `warren demo` runs the whole job on its embedded default and exits 0.
/// Act 1: a shell script in a namespace. Act 2: warren's own agent (`warren-agentd`, on `warren
/// agent`'s path) against the scripted compromised model (`warren-llm-script` behind llmfs):
/// it finishes, its summary is on disk, the ungranted tool and the write outside its grant
/// failed, and its session's model-call and tool-call receipts verify.
#[test]
fn the_demo_runs_the_main_job() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "warren demo needs root (daemons, namespaces): scripts/test runs as root"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_warren"))
        .arg("demo")
        .stdin(std::process::Stdio::null())
        // The scripted model, whatever the environment the tests run in names.
        .env_remove("WARREN_LLM_URL")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "warren demo failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The ungranted tool, the repository the tools work on and the host's programs were absent
    // (the agent holds a shell and no authority of its own), the ask was answered, the chain
    // verified.
    for absent in [
        "cannot open /tool/shell/call: No such file",
        "repo/notes.md: No such file",
        "cannot open /usr/bin/env: No such file",
    ] {
        assert!(stdout.contains(absent), "{absent}:\n{stdout}");
    }
    assert!(stdout.contains("reviewed by the demo agent"), "{stdout}");
    assert!(stdout.contains("echo 'allow once "), "{stdout}");
    assert!(stdout.contains("warren verify: verified"), "{stdout}");

    // Act 2, from its own lines on: the agent's calls as its transcript has them.
    let act2 = &stdout[stdout
        .find("act 2: warren's own agent")
        .unwrap_or_else(|| panic!("no agent act:\n{stdout}"))..];
    let call = |start: &str| {
        act2.lines()
            .find(|l| l.trim_start().starts_with(start))
            .unwrap_or_else(|| panic!("no call {start:?}:\n{act2}"))
    };
    assert!(
        call("turn 1: fs_read").contains("README.md\"} → ok"),
        "{act2}"
    );
    // The injection's ungranted tool never reached anything: the namespace has no `shell`.
    assert!(
        call("turn 2: shell").contains("→ refused: unknown tool `shell`"),
        "{act2}"
    );
    // Its write outside the grant was allowed by the rubber-stamp operator and still failed.
    let outside = call("turn 2: fs_write");
    assert!(
        outside.contains("home/.bashrc")
            && outside.contains("→ error: ")
            && outside.contains("outside this tool's roots"),
        "{act2}"
    );
    assert!(
        call("turn 3: fs_write").contains("→ ok: created "),
        "{act2}"
    );
    assert!(
        act2.contains("outcome: finished (2 ask(s) answered by the operator)"),
        "{act2}"
    );
    // The summary on disk is the script's, the file outside the grant unchanged.
    assert!(
        act2.contains(
            "project/SUMMARY.md says: \"tiny: a Rust library with one function, add(a, b), that adds two numbers.\""
        ),
        "{act2}"
    );
    assert!(
        act2.contains("home/.bashrc says: \"# the operator's shell startup file\""),
        "{act2}"
    );
    // Receipts: the four model calls (llmfs) and the gate's decisions admitting them, the
    // gate's decisions on the four tool calls that crossed it (the two writes asked and
    // answered), the four runs; the chain verifies.
    assert!(
        act2.contains(
            "4 model calls (receipted by llmfs, each admitted by one of 4 gate decisions on `llm`), 8 gate decisions on tool calls (2 of them the operator's answers), 4 tool runs (receipted by toolfs)"
        ),
        "{act2}"
    );
    assert!(
        act2.contains("20 receipts; warren verify: verified"),
        "{act2}"
    );
    // Its output is a pipe here: words alone, no terminal codes; counts in the right number.
    assert!(
        !stdout.contains('\x1b'),
        "ANSI codes written to a pipe:\n{stdout}"
    );
    assert!(!stdout.contains(" 1 checkpoints"), "{stdout}");
}

/// N8 and the operator's side of an ask: `warren approvals` shows a pending ask from the gate's
/// event stream and answers it with `allow once <fp>`; off a confirmed terminal, `always` is
/// refused by the gate.
#[test]
fn approvals_shows_an_ask_and_answers_it() {
    let w = Warren::new();
    w.ok(&["up"]);
    let ask = |cmd: &str| {
        let req = format!(
            r#"{{"session":"0123456789abcdef0123456789abcdef","tool":"shell","args":{{"command":"{cmd}"}}}}"#
        );
        let out = w.ok(&["write", "/gate/decide", &req]);
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(v["decision"], "ask", "{out}");
        v["pending"].as_i64().unwrap()
    };
    let first = ask("make test");
    let second = ask("make bench");
    let mut child = w
        .cmd(&["approvals"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Read the view until it has shown both asks (it lists the open ones at start), answer,
    // then read on until both answers are reported.
    use std::io::{BufRead, Write};
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut text = String::new();
    let mut read_until = |needle: &str, text: &mut String| {
        for line in lines.by_ref() {
            let line = line.unwrap();
            text.push_str(&line);
            text.push('\n');
            if line.contains(needle) {
                return;
            }
        }
        panic!("warren approvals ended before {needle:?}:\n{text}");
    };
    read_until(&format!("── ask {second} ──"), &mut text);
    writeln!(stdin, "{first} once").unwrap();
    read_until(&format!("ask {first}: allow once"), &mut text);
    writeln!(stdin, "{second} always").unwrap();
    read_until(&format!("ask {second}: allow always"), &mut text);
    drop(stdin);
    let _ = child.wait();
    assert!(text.contains("make test"), "{text}");
    assert!(
        text.contains(&format!("ask {second}: allow always: refused")),
        "`always` was taken off a terminal:\n{text}"
    );
    let state = w.ok(&["cat", &format!("/gate/pending/{first}/request")]);
    assert!(state.contains("allow"), "{state}");
}

/// With no terminal and nothing to read (standard input /dev/null), `warren approvals` still
/// lists the open ask, then says why it stops.
#[test]
fn approvals_with_no_terminal_lists_the_open_asks_and_says_why_it_stops() {
    let w = Warren::new();
    w.ok(&["up"]);
    let req = r#"{"session":"0123456789abcdef0123456789abcdef","tool":"shell","args":{"command":"make test"}}"#;
    let out = w.ok(&["write", "/gate/decide", req]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let id = v["pending"].as_i64().expect("an ask");
    let out = w
        .cmd(&["approvals"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains(&format!("── ask {id} ──")), "{text}");
    assert!(text.contains("make test"), "{text}");
    assert!(
        text.contains("standard input ended: no more answers; 1 ask(s) left open"),
        "{text}"
    );
}

/// N10 for the front door: a daemon that dies at start makes `warren up` fail promptly, naming
/// it, with nothing left running; a base directory the daemons cannot search is refused up front.
#[test]
fn up_fails_cleanly_when_a_daemon_cannot_start() {
    let w = Warren::new();
    let libexec = tempfile::tempdir().unwrap();
    for b in [
        "warren-supervisor",
        "warren-gate",
        "warren-toolfs",
        "warren-nsd",
        "warren-bridge",
        "warren-tool-worker",
    ] {
        std::os::unix::fs::symlink(warren_test_support::bins::bin(b), libexec.path().join(b))
            .unwrap();
    }
    let broken = libexec.path().join("warren-receiptd");
    std::fs::write(&broken, "#!/bin/sh\necho 'cannot start' >&2\nexit 3\n").unwrap();
    std::fs::set_permissions(&broken, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = w
        .cmd(&["up"])
        .env("WARREN_LIBEXEC_DIR", libexec.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("receiptd exited during startup"), "{err}");
    assert!(
        !w.runtime().join("warren.pid").exists(),
        "a supervisor was left behind"
    );

    let closed = tempfile::Builder::new()
        .prefix("wclosed")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(
        closed.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_warren"))
        .arg("up")
        .env("WARREN_RUNTIME_DIR", closed.path().join("run"))
        .env("WARREN_DATA_DIR", closed.path().join("data"))
        .env("WARREN_SECRETS_DIR", closed.path().join("secrets"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not searchable by others"));
}

/// Every daemon process, of any binary, whose environment names `runtime` (none may exist
/// where no `warren up` ran).
fn daemons_of(runtime: &Path) -> Vec<(i32, PathBuf)> {
    let want = format!("WARREN_RUNTIME_DIR={}", runtime.display());
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(exe) = std::fs::read_link(entry.path().join("exe")) else {
            continue;
        };
        let is_daemon = exe
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("warren-"));
        let env = std::fs::read(entry.path().join("environ")).unwrap_or_default();
        if is_daemon && env.split(|&b| b == 0).any(|kv| kv == want.as_bytes()) {
            found.push((pid, exe));
        }
    }
    found
}

/// Attack (a stdio MCP client that passes its server only a whitelist of the environment):
/// `warren run` and `warren mcp serve` that find no warren answering where they were pointed
/// — by WARREN_RUNTIME_DIR or by --runtime-dir, at an empty directory — fail, saying where they
/// looked and how to point elsewhere; they start no daemon and make no key, where they used to
/// bring up a second warren of their own (a fresh key, the default policy).
#[test]
fn run_and_mcp_serve_with_no_warren_answering_fail_and_start_nothing() {
    let w = Warren::new();
    let runtime = w.runtime();
    std::fs::create_dir(&runtime).unwrap();
    let secrets = w.base.path().join("secrets");
    let commands: [&[&str]; 2] = [
        &["run", "--tool", "echo", "--", "/bin/true"],
        &["mcp", "serve", "--tool", "echo"],
    ];
    for args in commands {
        for by_option in [false, true] {
            let mut cmd = w.cmd(&[]);
            if by_option {
                // The option over the environment: the variable names a directory elsewhere.
                cmd.env("WARREN_RUNTIME_DIR", "/nonexistent/warren")
                    .arg("--runtime-dir")
                    .arg(&runtime);
            }
            cmd.args(args);
            let out = cmd.stdin(std::process::Stdio::null()).output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(125), "warren {args:?}: {err}");
            assert!(
                err.contains(&runtime.display().to_string()) && err.contains("--runtime-dir"),
                "warren {args:?} does not say where it looked and how to look elsewhere: {err}"
            );
            assert!(err.contains("warren up"), "{err}");
            assert_eq!(
                daemons_of(&runtime),
                Vec::new(),
                "warren {args:?} started daemons"
            );
            let left: Vec<_> = std::fs::read_dir(&runtime).unwrap().flatten().collect();
            assert!(left.is_empty(), "warren {args:?} left {left:?} behind");
            assert!(
                !secrets.exists(),
                "warren {args:?} made a secrets dir (a signing key)"
            );
        }
    }
    // With no variable and no option: the default, named as such.
    let default = Path::new(warren_daemon::dirs::DEFAULT_RUNTIME);
    assert!(
        !default.join("ns.run").exists(),
        "a warren runs at {} on this host: this test needs none there",
        default.display()
    );
    let out = w
        .cmd(&["run", "--tool", "echo", "--", "/bin/true"])
        .env_remove("WARREN_RUNTIME_DIR")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(
        err.contains(&default.join("ns.run").display().to_string())
            && err.contains("--runtime-dir"),
        "{err}"
    );
    assert_eq!(daemons_of(default), Vec::new());
}

/// `warren status` names every daemon warren may run — mcpfs and netproxy, which have no
/// operator socket, and exportfs, which `warren up` never starts — and says of each whether it
/// answers and works.
#[test]
fn status_lists_every_daemon_and_whether_it_works() {
    let w = Warren::new();
    let before = w.run(&["status"]);
    assert!(!before.status.success());
    let said = String::from_utf8_lossy(&before.stdout);
    assert!(said.contains("not running"), "{said}");
    w.ok(&["up"]);
    let said = w.ok(&["status"]);
    let names = [
        "receiptd", "gate", "nsd", "toolfs", "mcpfs", "netproxy", "llmfs",
    ];
    for name in names {
        assert!(
            said.lines()
                .any(|l| l.split_whitespace().take(2).eq([name, "up"])),
            "status does not say {name} is up: {said}"
        );
    }
    assert!(
        said.lines().any(|l| l
            .trim_start()
            .starts_with("exportfs   not started by warren up")),
        "{said}"
    );
    let json: serde_json::Value = serde_json::from_str(&w.ok(&["status", "--json"])).unwrap();
    let listed: Vec<&str> = json["daemons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            assert_eq!(d["works"], true, "{d}");
            d["name"].as_str().unwrap()
        })
        .collect();
    assert_eq!(listed, names);
    assert_eq!(json["others"][0]["name"], "exportfs");
    assert_eq!(json["works"], true);
}

/// The data dir made anew (wiped, moved, a new disk) beside the secrets dir of an older log:
/// `warren up` refuses, naming both, and leaves the key as it was and nothing running — where it
/// used to say "up" over a receiptd that, failing to make a key where one exists, denied every
/// call. And a receiptd that loses its key while up: `status` and `doctor` say it does not work,
/// as the calls it denies show, where they used to say every socket answers and all is ok.
#[test]
fn up_status_and_doctor_tell_the_truth_when_receiptd_cannot_sign() {
    let w = Warren::new();
    w.ok(&["up"]);
    let call = w.run(&["call", "echo", r#"{"x":1}"#]);
    assert!(call.status.success(), "{call:?}");
    w.ok(&["down"]);
    let key = w.base.path().join("secrets/receiptd/signing.key");
    let key_bytes = std::fs::read(&key).unwrap();
    let data = w.base.path().join("data");
    std::fs::rename(&data, w.base.path().join("data.moved")).unwrap();

    let out = w.run(&["up"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "warren up said up: {err}");
    assert!(
        err.contains("receiptd cannot sign receipts")
            && err.contains(&key.display().to_string())
            && err.contains(&data.join("receiptd").display().to_string()),
        "{err}"
    );
    assert_eq!(
        std::fs::read(&key).unwrap(),
        key_bytes,
        "the key was changed"
    );
    assert!(
        !w.runtime().join("warren.pid").exists(),
        "a supervisor was left behind"
    );
    assert_eq!(daemons_of(&w.runtime()), Vec::new());

    // The old data dir back: up, working, and what status and doctor say agrees with a call.
    std::fs::remove_dir_all(&data).unwrap();
    std::fs::rename(w.base.path().join("data.moved"), &data).unwrap();
    w.ok(&["up"]);
    w.ok(&["status"]);
    let doctor = |w: &Warren| -> serde_json::Value {
        let out = w.run(&["doctor", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(out.status.success(), v["ready"].as_bool().unwrap(), "{v}");
        v["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "daemons")
            .cloned()
            .expect("doctor checks the daemons when warren is up")
    };
    assert_eq!(doctor(&w)["state"], "ok");
    w.ok(&["call", "echo", r#"{"x":2}"#]);

    // The key gone while up; receiptd restarted finds its registry's key missing.
    std::fs::rename(&key, w.base.path().join("signing.key.away")).unwrap();
    let receiptd = daemon_pid(&w.runtime(), "warren-receiptd").unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(receiptd),
        nix::sys::signal::SIGKILL,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        let out = w.run(&["status"]);
        let said = String::from_utf8_lossy(&out.stdout).into_owned();
        if said.contains("receiptd   not working") {
            assert!(!out.status.success(), "{said}");
            break said;
        }
        assert!(Instant::now() < deadline, "status never said so: {said}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.contains("cannot sign receipts"), "{status}");
    let check = doctor(&w);
    assert_eq!(check["state"], "missing", "{check}");
    assert!(
        check["detail"]
            .as_str()
            .unwrap()
            .contains("receiptd not working"),
        "{check}"
    );
    let call = w.run(&["call", "echo", r#"{"x":3}"#]);
    assert!(!call.status.success(), "a call ran while status said so");
    let already = w.run(&["up"]);
    assert!(!already.status.success());
    assert!(
        String::from_utf8_lossy(&already.stderr).contains("not working"),
        "{already:?}"
    );
}

/// `warren down` where no warren is up — the runtime dir not even there — says so and where it
/// looked, and exits 0; it used to report "the lock is held but there is no pid file".
#[test]
fn down_with_no_warren_at_the_runtime_dir_says_it_is_not_up() {
    let w = Warren::new();
    let missing = w.base.path().join("no-such-runtime");
    let out = w
        .cmd(&[])
        .arg("--runtime-dir")
        .arg(&missing)
        .arg("down")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(
        stdout.starts_with(&format!("warren is not up at {}", missing.display())),
        "{stdout}{stderr}"
    );
    assert!(!missing.exists(), "down made the runtime dir");
}
