//! The gate from inside `warren run`, through the kernel's FUSE mount: a confined shell writes to
//! `/tool/<name>/call` and the real bridge, toolfs, gate and receiptd decide, ask, run and
//! receipt. Effects are counted on the host (each `shell` call that runs appends one line to a
//! file the tool's worker may write), so "ran" and "did not run" are facts, not envelopes alone.
//! Needs root, /dev/fuse and the workspace's binaries; the terminal test needs tmux.
//!
//! Why one file: every test shares one set of daemons, fixtures and the effect counter; each is one
//! gate rule seen from inside a namespace.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Output};
use std::time::{Duration, Instant};

use common::{Warren, envelopes, field, fingerprint, next_ask};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// A shell function for scripts: `call TOOL JSON` — one open is one call; prints the envelope.
const CALL: &str =
    r#"call() { exec 3<>"/tool/$1/call"; printf '%s' "$2" >&3; cat <&3; exec 3<&-; echo; }"#;

/// A directory the `shell` tool's worker may write (its authority), and a spec granting `tools`
/// with `shell` rooted there.
struct Workdir {
    dir: tempfile::TempDir,
    spec: PathBuf,
}

impl Workdir {
    fn new(w: &Warren, tools: &str) -> Workdir {
        let dir = tempfile::Builder::new()
            .prefix("wgf")
            .tempdir_in("/tmp")
            .unwrap();
        common::open_to_shell_workers(dir.path());
        let spec = w.base.path().join("gate.ns");
        std::fs::write(
            &spec,
            format!(
                "mount tool /tool {tools}\ntool shell -w {}\n",
                dir.path().display()
            ),
        )
        .unwrap();
        Workdir { dir, spec }
    }

    fn path(&self) -> &str {
        self.dir.path().to_str().unwrap()
    }

    /// The arguments of a `shell` call that appends `line` to the effect log.
    fn append(&self, line: &str) -> String {
        format!(
            r#"{{"command":"echo {line} >> {0}/effects","cwd":"{0}"}}"#,
            self.path()
        )
    }

    /// The lines the calls that ran appended.
    fn effects(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("effects"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    fn spec(&self) -> &str {
        self.spec.to_str().unwrap()
    }
}

/// Waits for `child` at most `limit`; kills it and fails the test if it is still running.
fn finish(mut child: Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "warren run did not end within {limit:?}:\n{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Writes `verb` to ask `id`'s ctl on a connection the gate handed out as a confirmed-tty
/// operator's (what `warren approvals` and `warren run` get on a terminal).
fn answer_on_confirmed_tty(w: &Warren, id: i64, verb: &str) -> Result<String, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let record = warren_gate::control::ControlRecord {
            version: 1,
            kind: warren_gate::control::RecordKind::Operator,
            confirmed_tty: true,
            name: Some("gate_fuse test".into()),
            ..Default::default()
        };
        warren_gate::control::hand_over(&w.runtime().join("gate.ctl"), &record, &theirs)
            .map_err(|e| e.to_string())?;
        ours.set_nonblocking(true).unwrap();
        let client =
            warren_9p::Client::new(tokio::net::UnixStream::from_std(ours).unwrap(), 1 << 20)
                .await
                .map_err(|e| e.to_string())?;
        let root = client.attach("test", "").await.map_err(|e| e.to_string())?;
        warren_gate::approvals::answer(&root, id, verb).await
    })
}

fn write_ctl(w: &Warren, id: i64, verb: &str) -> Output {
    w.run(&["write", &format!("/gate/pending/{id}/ctl"), verb])
}

/// `allow session` (only on a confirmed terminal) covers the identical call — it runs without
/// asking — and not one whose argument changed, which asks again.
///
/// A tool's result marks the session `untrusted_context`, which raises every later exec call to
/// an ask whatever the grants (context only tightens). So the three calls are made while the
/// first is still running (its `shell` command waits for a file the test creates last): all
/// three are decided on an untainted session, and only the fingerprint tells them apart.
#[test]
fn allow_session_covers_the_identical_call_not_a_changed_argument() {
    let w = Warren::up();
    let work = Workdir::new(&w, "shell");
    let sync = SyncDir::new();
    let s = sync.path();
    let d = work.path();
    let held = |line: &str| {
        format!(
            r#"{{"command":"echo {line} >> {d}/effects; while [ ! -e {d}/go ]; do sleep 0.05; done","cwd":"{d}"}}"#
        )
    };
    let (a, b) = (held("a"), work.append("b"));
    let script = format!(
        "{CALL}
         call shell '{a}' > {s}/1 &
         while [ ! -e {s}/second ]; do sleep 0.01; done
         call shell '{a}' > {s}/2 &
         while [ ! -e {s}/third ]; do sleep 0.01; done
         call shell '{b}' > {s}/3
         wait
         cat {s}/1 {s}/2 {s}/3"
    );
    let agent = w.spawn_sh(
        &["--asks", "operator", "--rw", s, "--ns", work.spec()],
        &script,
    );

    let (first, request) = next_ask(&w, 0);
    assert!(field(&request, "args").contains("echo a"), "{request}");
    assert_eq!(field(&request, "context"), "-", "{request}");
    // On the plain operator socket `allow session` is refused: it needs the confirmed terminal.
    let plain = write_ctl(&w, first, "allow session");
    assert!(!plain.status.success(), "allow session without a terminal");
    answer_on_confirmed_tty(&w, first, "allow session").unwrap();
    wait_until("the first call runs", || work.effects() == ["a"]);

    // The identical call is allowed by the grant, without an ask (it then waits for the
    // worker, which serves one call at a time).
    sync.touch("second");
    let session = field(&request, "session").to_owned();
    wait_until("the identical call is decided", || {
        w.decisions(&session).iter().any(|d| {
            d["basis"]
                .as_str()
                .unwrap_or("")
                .starts_with("session_grant:")
        })
    });
    let listed = text(&w.run(&["ls", "/gate/pending"]).stdout);
    assert!(
        listed.trim().is_empty(),
        "the identical call asked: {listed}"
    );

    // The changed argument asks, on the same untainted session.
    sync.touch("third");
    let (second, request2) = next_ask(&w, first);
    assert!(field(&request2, "args").contains("echo b"), "{request2}");
    assert_eq!(field(&request2, "context"), "-", "{request2}");
    assert_ne!(fingerprint(&request2), fingerprint(&request));
    assert!(write_ctl(&w, second, "deny").status.success());
    std::fs::write(work.dir.path().join("go"), "").unwrap();

    let out = finish(agent, Duration::from_secs(60));
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let statuses: Vec<_> = envelopes(&stdout)
        .iter()
        .map(|e| e["status"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(statuses, ["ok", "ok", "denied"], "{stdout}");
    assert_eq!(work.effects(), ["a", "a"]);
}

/// A host directory the confined shell sees (bound read-write): how the test tells it to go on.
struct SyncDir(tempfile::TempDir);

impl SyncDir {
    fn new() -> SyncDir {
        let dir = tempfile::Builder::new()
            .prefix("wgs")
            .tempdir_in("/tmp")
            .unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        SyncDir(dir)
    }

    fn path(&self) -> &str {
        self.0.path().to_str().unwrap()
    }

    fn touch(&self, name: &str) {
        std::fs::write(self.0.path().join(name), "").unwrap();
    }
}

/// Waits (bounded) until `done` holds.
fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An ask nobody answers expires into a deny (basis `expiry`); the tool never runs. The gate's
/// TTL comes from `WARREN_GATE_ASK_TTL_MS` through the supervisor (2 s here, 10 min by default:
/// without it this test would hit its own limit and fail).
#[test]
fn an_unanswered_ask_expires_into_a_deny() {
    let w = Warren::up_with(&[("WARREN_GATE_ASK_TTL_MS", "2000")]);
    let work = Workdir::new(&w, "shell");
    let script = format!("{CALL}\ncall shell '{}'", work.append("late"));
    let agent = w.spawn_sh(&["--asks", "operator", "--ns", work.spec()], &script);
    let (id, request) = next_ask(&w, 0);
    let out = finish(agent, Duration::from_secs(60));
    let stdout = text(&out.stdout);
    let env = envelopes(&stdout);
    assert_eq!(env.len(), 1, "{stdout}\n{}", text(&out.stderr));
    assert_eq!(env[0]["status"], "denied", "{stdout}");
    assert_eq!(env[0]["basis"], "expiry", "{stdout}");
    assert_eq!(
        env[0]["content"], "denied: the ask for this call was not answered in time",
        "{stdout}"
    );
    assert!(work.effects().is_empty(), "an expired ask ran");
    // Too late to answer now.
    assert!(
        !write_ctl(&w, id, &format!("allow once {}", fingerprint(&request)))
            .status
            .success()
    );
    assert!(work.effects().is_empty());
    let expired = w
        .decisions(field(&request, "session"))
        .into_iter()
        .any(|d| d["basis"] == "expiry" && d["verdict"] == "deny");
    assert!(expired, "no expiry deny among the session's receipts");
}

/// Signals a process; the supervisor is stopped while a daemon is down so it cannot restart it.
fn signal(pid: i32, sig: Signal) {
    kill(Pid::from_raw(pid), sig).unwrap();
}

/// Continues a stopped supervisor when dropped (also when an assertion fails), so that
/// `warren down` can stop it.
struct Stopped(i32);

impl Stopped {
    fn supervisor(w: &Warren) -> Stopped {
        let pid = w.supervisor_pid();
        signal(pid, Signal::SIGSTOP);
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.0), Signal::SIGCONT);
    }
}

/// A killed gate denies, never allows: the call waiting on an ask when the gate dies is denied,
/// and so are the calls made while it is down — even a read-tier call the gate would allow.
#[test]
fn a_killed_gate_denies_the_waiting_call_and_every_call_while_it_is_down() {
    let w = Warren::up();
    let work = Workdir::new(&w, "shell echo");
    let script = format!(
        "{CALL}\ncall shell '{}'\ncall echo '{{\"text\":\"hi\"}}'\ncall shell '{}'",
        work.append("waited"),
        work.append("later")
    );
    let agent = w.spawn_sh(&["--asks", "operator", "--ns", work.spec()], &script);
    let (_, request) = next_ask(&w, 0);
    assert!(field(&request, "tool") == "shell", "{request}");
    let supervisor = Stopped::supervisor(&w);
    signal(w.daemon_pid("warren-gate"), Signal::SIGKILL);
    let out = finish(agent, Duration::from_secs(60));
    drop(supervisor);
    let stdout = text(&out.stdout);
    let env = envelopes(&stdout);
    assert_eq!(env.len(), 3, "{stdout}\n{}", text(&out.stderr));
    for e in &env {
        assert_eq!(e["status"], "denied", "{stdout}");
        assert!(
            e["basis"].as_str().unwrap().starts_with("gate_unavailable"),
            "{stdout}"
        );
    }
    assert!(work.effects().is_empty(), "a call ran without its gate");
}

/// A stopped or killed receiptd denies every call, even a read the gate would allow: no
/// decision is answered before its receipt is written. (The same calls are allowed first, so a
/// gate that ignored receiptd would fail this.)
#[test]
fn a_stopped_or_killed_receiptd_denies_every_call() {
    let w = Warren::up();
    let work = Workdir::new(&w, "shell echo");
    let echo = r#"{"text":"hi"}"#;
    let (code, out, err) = w.sh(
        &["--ns", work.spec()],
        &format!("{CALL}\ncall echo '{echo}'"),
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(envelopes(&out)[0]["status"], "ok", "{out}");

    let supervisor = Stopped::supervisor(&w);
    let receiptd = w.daemon_pid("warren-receiptd");
    // Stopped: the gate's append times out (10 s) and the decision is a deny.
    signal(receiptd, Signal::SIGSTOP);
    let (code, out, err) = w.sh(
        &["--ns", work.spec()],
        &format!("{CALL}\ncall echo '{echo}'"),
    );
    assert_eq!(code, 0, "{err}");
    let env = envelopes(&out);
    assert_eq!(env[0]["status"], "denied", "{out}");
    assert_eq!(env[0]["basis"], "receipts_unavailable", "{out}");

    // Killed: the same, at once; an exec call is denied without an ask being shown.
    signal(receiptd, Signal::SIGKILL);
    let (code, out, err) = w.sh(
        &["--asks", "operator", "--ns", work.spec()],
        &format!(
            "{CALL}\ncall echo '{echo}'\ncall shell '{}'",
            work.append("unreceipted")
        ),
    );
    drop(supervisor);
    assert_eq!(code, 0, "{err}");
    let env = envelopes(&out);
    assert_eq!(env.len(), 2, "{out}");
    for e in &env {
        assert_eq!(e["status"], "denied", "{out}");
        assert_eq!(e["basis"], "receipts_unavailable", "{out}");
    }
    assert!(work.effects().is_empty(), "a call ran unreceipted");
}

/// Two (here five) identical calls racing for one `allow once`: call A asks; at the moment its
/// `allow once` is written, four identical calls are fired from inside. Whichever spends the
/// token runs; every other is denied (or asks, and is denied). Exactly one effect.
#[test]
fn identical_calls_racing_one_allow_once_run_exactly_once() {
    let w = Warren::up();
    let work = Workdir::new(&w, "shell");
    // The starting signal for the racing calls.
    let sync = SyncDir::new();
    let s = sync.path();
    let a = work.append("ran");
    let script = format!(
        "{CALL}
         call shell '{a}' > {s}/a &
         while [ ! -e {s}/go ]; do sleep 0.01; done
         for i in 1 2 3 4; do call shell '{a}' > {s}/c$i & done
         wait
         cat {s}/a {s}/c1 {s}/c2 {s}/c3 {s}/c4"
    );
    let mut agent = w.spawn_sh(
        &["--asks", "operator", "--rw", s, "--ns", work.spec()],
        &script,
    );
    let (first, request) = next_ask(&w, 0);
    let fp = fingerprint(&request).to_owned();
    sync.touch("go");
    let out = write_ctl(&w, first, &format!("allow once {fp}"));
    assert!(out.status.success(), "{}", text(&out.stderr));
    // Every later ask is a loser of the race asking again: deny it.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut denied = vec![];
    while agent.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the racing calls did not end");
        let listed = w.run(&["ls", "/gate/pending"]);
        let open: Vec<i64> = text(&listed.stdout)
            .lines()
            .filter_map(|l| l.trim_end_matches('/').parse::<i64>().ok())
            .filter(|id| *id > first && !denied.contains(id))
            .collect();
        for id in open {
            let req = text(
                &w.run(&["cat", &format!("/gate/pending/{id}/request")])
                    .stdout,
            );
            if req.is_empty() {
                continue; // closed since the listing
            }
            assert_eq!(fingerprint(&req), fp, "another call asked: {req}");
            if write_ctl(&w, id, "deny").status.success() {
                denied.push(id);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = agent.wait_with_output().unwrap();
    let stdout = text(&out.stdout);
    let statuses: Vec<String> = envelopes(&stdout)
        .iter()
        .map(|e| e["status"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(statuses.len(), 5, "{stdout}\n{}", text(&out.stderr));
    assert_eq!(
        statuses.iter().filter(|s| *s == "ok").count(),
        1,
        "{stdout}"
    );
    assert_eq!(
        work.effects(),
        ["ran"],
        "one allow once ran other than once"
    );
}

/// With no terminal (and the default `--asks terminal`), `warren run` denies its command's ask
/// at once, says on stderr how to answer from `warren approvals`, and the receipt of the answer
/// names it as who answered.
#[test]
fn with_no_terminal_an_ask_is_denied_at_once_naming_warren_approvals() {
    let w = Warren::up();
    let work = Workdir::new(&w, "shell");
    let agent = w.spawn_sh(
        &["--ns", work.spec()],
        &format!("{CALL}\ncall shell '{}'", work.append("x")),
    );
    // Nobody answers here: only the launcher can end this wait before the 10-minute expiry.
    let out = finish(agent, Duration::from_secs(60));
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("warren approvals") && stderr.contains("no terminal"),
        "{stderr}"
    );
    let env = envelopes(&stdout);
    assert_eq!(env.len(), 1, "{stdout}");
    assert_eq!(env[0]["status"], "denied", "{stdout}");
    assert!(work.effects().is_empty());
    let session = env[0]["receipt"]["scope"].as_str().unwrap();
    let answered = w.decisions(session).into_iter().any(|d| {
        d["basis"] == "answer:deny"
            && d["answered_by"]
                .as_str()
                .is_some_and(|by| by.contains("warren run (no terminal)"))
    });
    assert!(answered, "no receipt of the launcher's deny");
}

/// A tmux server of the test's own (its own socket), for driving `warren run` on a real pty.
struct Tmux {
    socket: PathBuf,
}

impl Tmux {
    fn start(dir: &Path, command: &str) -> Tmux {
        let t = Tmux {
            socket: dir.join("tmux.sock"),
        };
        match t
            .cmd(&[
                "new-session",
                "-d",
                "-s",
                "t",
                "-x",
                "160",
                "-y",
                "60",
                command,
            ])
            .status()
        {
            Ok(s) if s.success() => t,
            Ok(s) => panic!("tmux new-session: {s}"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                panic!("tmux is not installed (scripts/install-test-deps installs it)")
            }
            Err(e) => panic!("tmux: {e}"),
        }
    }

    fn cmd(&self, args: &[&str]) -> std::process::Command {
        let mut c = std::process::Command::new("tmux");
        c.arg("-S").arg(&self.socket).arg("-f").arg("/dev/null");
        c.args(args);
        c
    }

    fn screen(&self) -> String {
        text(
            &self
                .cmd(&["capture-pane", "-p", "-t", "t"])
                .output()
                .unwrap()
                .stdout,
        )
    }

    /// Waits (bounded) until the screen shows `what`.
    fn wait_for(&self, what: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let screen = self.screen();
            if screen.contains(what) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "the terminal never showed {what:?}:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd(&["kill-server"]).output();
    }
}

/// On a terminal, `warren run` shows its command's ask (escaped request, byte length,
/// fingerprint prefix), takes the answer from the keyboard — the namespace does not get those
/// keys — and `once` runs the call once.
#[test]
fn on_a_terminal_warren_run_asks_and_once_runs_the_call() {
    let w = Warren::up();
    let work = Workdir::new(&w, "shell");
    let base = w.base.path();
    // The confined script: one call, then whatever input reached the namespace.
    let script = format!(
        "{CALL}\ncall shell '{}'\nleftover=$(timeout 1 head -n 1); echo \"LEFTOVER=[$leftover]\"",
        work.append("typed")
    );
    std::fs::write(base.join("agent.sh"), &script).unwrap();
    let drive = format!(
        "export WARREN_RUNTIME_DIR={r} WARREN_DATA_DIR={d} WARREN_SECRETS_DIR={s}\n\
         {warren} run --ns {spec} -- /bin/sh -c \"$(cat {b}/agent.sh)\" > {b}/out 2> {b}/err\n\
         echo $? > {b}/exit\n",
        r = w.runtime().display(),
        d = base.join("data").display(),
        s = base.join("secrets").display(),
        warren = env!("CARGO_BIN_EXE_warren"),
        spec = work.spec(),
        b = base.display(),
    );
    std::fs::write(base.join("drive.sh"), drive).unwrap();
    let command = format!("/bin/sh {}/drive.sh", base.display());
    let tmux = Tmux::start(base, &command);
    let screen = tmux.wait_for("once, session or deny");
    assert!(screen.contains("tool shell"), "{screen}");
    assert!(screen.contains("bytes "), "{screen}");
    let (_, request) = next_ask(&w, 0);
    let fp = fingerprint(&request);
    assert!(screen.contains(&format!("fingerprint {fp}")), "{screen}");
    assert!(work.effects().is_empty(), "ran before it was answered");
    tmux.cmd(&["send-keys", "-t", "t", "once", "Enter"])
        .status()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !base.join("exit").exists() {
        assert!(
            Instant::now() < deadline,
            "warren run did not end:\n{}",
            tmux.screen()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let stdout = std::fs::read_to_string(base.join("out")).unwrap();
    let stderr = std::fs::read_to_string(base.join("err")).unwrap();
    let env = envelopes(&stdout);
    assert_eq!(env.len(), 1, "{stdout}\n{stderr}");
    assert_eq!(env[0]["status"], "ok", "{stdout}");
    assert_eq!(work.effects(), ["typed"]);
    assert!(
        stdout.contains("LEFTOVER=[]"),
        "the answer typed at the prompt reached the namespace: {stdout}"
    );
}

/// `warren run` on a tmux pty running `script` confined by `spec` (its stdout and stderr the
/// terminal's, as an agent's would be); `exit` appears in `base` when it ends.
fn run_on_terminal(w: &Warren, spec: &str, script: &str) -> Tmux {
    let base = w.base.path();
    std::fs::write(base.join("agent.sh"), script).unwrap();
    let drive = format!(
        "export WARREN_RUNTIME_DIR={r} WARREN_DATA_DIR={d} WARREN_SECRETS_DIR={s}\n\
         {warren} run --ns {spec} -- /bin/sh -c \"$(cat {b}/agent.sh)\"\n\
         echo $? > {b}/exit\nsleep 600\n",
        r = w.runtime().display(),
        d = base.join("data").display(),
        s = base.join("secrets").display(),
        warren = env!("CARGO_BIN_EXE_warren"),
        b = base.display(),
    );
    std::fs::write(base.join("drive.sh"), drive).unwrap();
    let command = format!("/bin/sh {}/drive.sh", base.display());
    Tmux::start(base, &command)
}

/// Waits (bounded) for `warren run` to end.
fn wait_exit(w: &Warren, tmux: &Tmux) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !w.base.path().join("exit").exists() {
        assert!(
            Instant::now() < deadline,
            "warren run did not end:\n{}",
            tmux.screen()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The `args` line of the screen.
fn args_line(screen: &str) -> String {
    screen
        .lines()
        .find(|l| l.trim_start().starts_with("args "))
        .unwrap_or_default()
        .to_owned()
}

/// A forged prompt as an agent prints it: cursor home, screen cleared, an ask for `ls`.
const FORGED_PROMPT: &str = "\\033[H\\033[2J\\033[1mwarren run: the command asks (ask 1):\\033[0m\\r\\n  \
    tool shell\\r\\n  bytes 16\\r\\n  args {\\\"command\\\":\\\"ls\\\"}\\r\\n  \
    state open\\r\\nallow? once, session or deny: ";

/// The arguments of the hidden call: what really runs if the operator allows it.
fn hidden_call(work: &Workdir) -> String {
    format!(
        r#"{{"command":"echo PWNED >> {0}/effects; id","cwd":"{0}"}}"#,
        work.path()
    )
}

/// The prompt an agent redraws: a confined command turns `onlcr` off, raises a `shell` call in
/// the background and, once the prompt is up, prints cursor movements that draw a whole forged
/// prompt (`args {"command":"ls"}`) over it. The launcher holds the namespace's output while it
/// asks and draws the ask on a fresh surface: the screen the operator answers shows the real
/// command, the forged bytes reach the terminal only after the answer, and the denied call never
/// runs.
#[test]
fn an_ask_on_the_terminal_cannot_be_redrawn_by_the_namespace() {
    let w = Warren::up();
    let work = Workdir::new(&w, "shell");
    let sync = tempfile::Builder::new()
        .prefix("wsync")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(sync.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let sync_dir = sync.path().display();
    std::fs::write(
        &work.spec,
        format!(
            "mount tool /tool shell\ntool shell -w {}\nbind -w {sync_dir} {sync_dir}\n",
            work.path()
        ),
    )
    .unwrap();
    let script = format!(
        "{CALL}\nstty -onlcr\n( call shell '{hidden}' > /dev/null 2>&1 ) &\n\
         until [ -e {sync_dir}/go ]; do sleep 0.05; done\n\
         printf \"{FORGED_PROMPT}\"\ntouch {sync_dir}/forged\nwait\n",
        hidden = hidden_call(&work),
    );
    let tmux = run_on_terminal(&w, work.spec(), &script);
    tmux.wait_for("once, session or deny");
    // The forgery, written while the prompt is up.
    std::fs::write(sync.path().join("go"), "").unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !sync.path().join("forged").exists() {
        assert!(Instant::now() < deadline, "the agent never forged");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Give a relay that lets the bytes through every chance to draw them.
    let shown_until = Instant::now() + Duration::from_secs(3);
    let screen = loop {
        let screen = tmux.screen();
        assert!(
            !screen.contains(r#"{"command":"ls"}"#),
            "the namespace redrew the prompt:\n{screen}"
        );
        if Instant::now() > shown_until {
            break screen;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let args = args_line(&screen);
    assert!(
        args.contains("echo PWNED") && args.contains("; id"),
        "the args line does not show the real command: {args:?}\n{screen}"
    );
    assert!(screen.contains("once, session or deny"), "{screen}");
    assert!(work.effects().is_empty(), "ran before it was answered");
    tmux.cmd(&["send-keys", "-t", "t", "deny", "Enter"])
        .status()
        .unwrap();
    // The held bytes come through once the ask is answered: they were written, and held.
    tmux.wait_for(r#"{"command":"ls"}"#);
    wait_exit(&w, &tmux);
    assert!(work.effects().is_empty(), "the denied call ran");
}

/// The surface prepared before the ask: the agent draws a forged prompt, then leaves an OSC
/// string open (a terminal swallows what follows it as a window title) and raises its call. The
/// launcher ends the open string and draws the ask on a cleared alternate screen: the operator
/// sees the real command, not the forged one left on the screen.
#[test]
fn an_ask_is_drawn_on_a_surface_the_namespace_did_not_prepare() {
    let w = Warren::up();
    let work = Workdir::new(&w, "shell");
    let script = format!(
        "{CALL}\nstty -onlcr\nprintf \"{FORGED_PROMPT}\\033]2;\"\ncall shell '{hidden}' > /dev/null 2>&1\n",
        hidden = hidden_call(&work),
    );
    let tmux = run_on_terminal(&w, work.spec(), &script);
    next_ask(&w, 0);
    let screen = tmux.wait_for("echo PWNED");
    let args = args_line(&screen);
    assert!(
        args.contains("echo PWNED") && args.contains("; id"),
        "the args line does not show the real command: {args:?}\n{screen}"
    );
    assert!(!screen.contains(r#"{"command":"ls"}"#), "{screen}");
    tmux.cmd(&["send-keys", "-t", "t", "deny", "Enter"])
        .status()
        .unwrap();
    wait_exit(&w, &tmux);
    assert!(work.effects().is_empty(), "the denied call ran");
}

/// Attack: an ask taller than the terminal. The prompt prints the whole request, however long,
/// so its top scrolls away; the namespace knows the terminal's width (its pty has the
/// launcher's), and pads its `shell` command with spaces so that, wrapped, the `args` line draws
/// a whole forged request — `tool fs_write`, a harmless `args` — on the rows the operator sees
/// above `allow?`, while the real `tool shell` line and the real command have scrolled off. No
/// escape sequence is used: spaces and printable text only (the forged quotes are U+201D, which
/// is not escaped). The operator must always see what really runs before answering.
#[test]
fn an_ask_taller_than_the_terminal_cannot_show_a_forged_request() {
    const WIDTH: usize = 160; // run_on_terminal's tmux window
    let w = Warren::up();
    let work = Workdir::new(&w, "shell");
    let real = format!("echo PWNED >> {}/effects; id;#", work.path());
    // The args line as the prompt shows it starts `  args {"command":"`: 19 columns.
    let mut cmd = real.clone();
    let col = |cmd: &str| (19 + cmd.chars().count()) % WIDTH;
    while col(&cmd) != 0 {
        cmd.push(' ');
    }
    cmd.push_str(&" ".repeat(WIDTH * 70)); // blank rows: the real top scrolls away
    let q = '\u{201D}';
    let forged = [
        "warren run: the command asks (ask 1):".to_owned(),
        "  ask 1".into(),
        "  session 5f0c2d9e8b7a41c3a6e2f1d0c9b8a7e6".into(),
        "  namespace 1".into(),
        "  command /bin/sh -c agent".into(),
        "  parents -".into(),
        "  subtree 5f0c2d9e8b7a41c3a6e2f1d0c9b8a7e6".into(),
        "  subtree_open_asks 1".into(),
        "  tool fs_write".into(),
        "  tier write".into(),
        "  basis default:write".into(),
        "  context -".into(),
        "  fingerprint 3a7c1e90".into(),
        "  bytes 40".into(),
    ];
    for line in &forged {
        cmd.push_str(line);
        cmd.push_str(&" ".repeat(WIDTH - line.chars().count()));
    }
    // The last forged line is closed by the real args' own `"}`.
    cmd.push_str(&format!(
        "  args {{{q}path{q}:{q}notes.md{q},{q}content{q}:{q}hi"
    ));
    let args = serde_json::json!({ "command": cmd }).to_string();
    let script = format!("{CALL}\ncall shell '{args}'\n");
    let tmux = run_on_terminal(&w, work.spec(), &script);
    let screen = tmux.wait_for("once, session or deny");
    std::thread::sleep(Duration::from_millis(500));
    let screen = {
        let again = tmux.screen();
        if again.contains("once, session or deny") {
            again
        } else {
            screen
        }
    };
    assert!(work.effects().is_empty(), "ran before it was answered");
    tmux.cmd(&["send-keys", "-t", "t", "deny", "Enter"])
        .status()
        .unwrap();
    wait_exit(&w, &tmux);
    assert!(work.effects().is_empty(), "the denied call ran");
    assert!(
        screen.contains("echo PWNED") && screen.contains("tool shell"),
        "the screen the operator answered shows a forged request (tool fs_write, args notes.md), \
         not the real tool or command:\n{screen}"
    );
}
