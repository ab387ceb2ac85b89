//! Supervision under fire: each daemon is SIGKILLed in turn while a confined agent makes calls.
//! Each one comes back; calls either keep working or fail closed; and afterwards the exported
//! chain verifies, every call that ran has an allowing decision receipt before its effect, and
//! `warren log -f`, following throughout, printed every receipt.
//! Needs root, /dev/fuse and the workspace's binaries.
//!
//! Why one file: the agent, follower and chain checks are shared by every kill scenario.

mod common;

use std::io::{BufRead, Write};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::Warren;
use serde_json::Value;
use sha2::Digest;

/// The agent: one call per line of input, one line of output per call — the label, then the
/// envelope, or `FAILED` when the call file could not be used. A failed call never ends the loop.
const AGENT: &str = r#"while read -r i; do
  if r=$( ( exec 3<>/tool/echo/call && printf '{"text":"%s"}' "$i" >&3 && cat <&3 ) 2>/dev/null ); then
    echo "$i $r"
  else
    echo "$i FAILED"
  fi
done"#;

/// What one call came to, as the agent saw it.
#[derive(Debug)]
enum Outcome {
    Envelope(Value),
    Failed,
}

struct Agent {
    child: std::process::Child,
    input: Option<std::process::ChildStdin>,
    output: mpsc::Receiver<(String, Outcome)>,
    /// Calls sent and not yet collected.
    sent: Vec<String>,
}

impl Agent {
    fn start(w: &Warren) -> Agent {
        let mut child = w
            .cmd(&["run", "--tool", "echo", "--", "/bin/sh", "-c", AGENT])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let input = child.stdin.take();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let (label, rest) = line.split_once(' ').unwrap_or((&line, ""));
                let outcome = match rest {
                    "FAILED" => Outcome::Failed,
                    envelope => Outcome::Envelope(serde_json::from_str(envelope).unwrap()),
                };
                let outcome = (label.to_owned(), outcome);
                if tx.send(outcome).is_err() {
                    break;
                }
            }
        });
        Agent {
            child,
            input,
            output: rx,
            sent: Vec::new(),
        }
    }

    /// Starts one call without waiting for it; false if the agent is gone.
    fn send(&mut self, label: &str) -> bool {
        let Some(input) = self.input.as_mut() else {
            return false;
        };
        if writeln!(input, "{label}").is_err() {
            self.input = None;
            return false;
        }
        self.sent.push(label.to_owned());
        true
    }

    /// What every call sent so far came to, in order; stops at the first the agent did not
    /// answer because it is gone (its namespace ended).
    fn collect(&mut self) -> Vec<(String, Outcome)> {
        let mut got = Vec::new();
        for label in std::mem::take(&mut self.sent) {
            // Bounded: a call that hangs breaks "fail closed, never hang".
            match self.output.recv_timeout(Duration::from_secs(60)) {
                Ok((answered, outcome)) => {
                    assert_eq!(answered, label, "calls answered out of order");
                    got.push((label, outcome));
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    self.input = None;
                    break;
                }
                Err(mpsc::RecvTimeoutError::Timeout) => panic!("call {label} hung"),
            }
        }
        got
    }

    /// Whether its namespace still answers calls.
    fn alive(&self) -> bool {
        self.input.is_some()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.input = None;
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A receipt's args digest as bare hex (the gate writes it bare, toolfs as `sha256:<hex>`).
fn args_hex(receipt: &Value) -> String {
    let d = receipt["digests"]["args"].as_str().unwrap_or_default();
    d.strip_prefix("sha256:").unwrap_or(d).to_owned()
}

/// The echo calls (by label: their argument) among `ran` that no allowing decision receipt in
/// `receipts` covers.
fn ran_without_an_allow<'a>(
    ran: impl IntoIterator<Item = &'a String>,
    receipts: &[Value],
) -> Vec<&'a String> {
    ran.into_iter()
        .filter(|label| {
            let args = hex::encode(sha2::Sha256::digest(format!(r#"{{"text":"{label}"}}"#)));
            !receipts.iter().any(|r| {
                r["kind"] == "decision"
                    && r["subject"]["verdict"] == "allow"
                    && r["subject"]["tool"] == "echo"
                    && args_hex(r) == args
            })
        })
        .collect()
}

/// The check above can fail: a call whose only decision was a deny, or was for other arguments,
/// is reported.
#[test]
fn a_call_without_an_allowing_decision_is_caught() {
    let decision = |verdict: &str, text: &str| {
        let args = hex::encode(sha2::Sha256::digest(format!(r#"{{"text":"{text}"}}"#)));
        serde_json::json!({"kind": "decision", "subject": {"verdict": verdict, "tool": "echo"},
                           "digests": {"args": args}})
    };
    let receipts = [decision("allow", "a"), decision("deny", "b")];
    let ran = ["a".to_owned(), "b".to_owned(), "c".to_owned()];
    assert_eq!(ran_without_an_allow(&ran, &receipts), [&ran[1], &ran[2]]);
}

/// `warren log -f --json` running through every restart, its lines gathered as (scope, seq).
struct Follower {
    child: std::process::Child,
    lines: mpsc::Receiver<(String, u64)>,
    seen: std::collections::BTreeSet<(String, u64)>,
    /// Its stderr, shown when it falls behind.
    stderr: tempfile::NamedTempFile,
}

impl Follower {
    fn start(w: &Warren) -> Follower {
        let stderr = tempfile::NamedTempFile::new().unwrap();
        let mut child = w
            .cmd(&["log", "-f", "--json"])
            .stdout(Stdio::piped())
            .stderr(stderr.reopen().unwrap())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let v: Value = serde_json::from_str(&line).unwrap();
                let key = (
                    v["scope"].as_str().unwrap().to_owned(),
                    v["seq"].as_u64().unwrap(),
                );
                if tx.send(key).is_err() {
                    break;
                }
            }
        });
        Follower {
            child,
            lines,
            seen: Default::default(),
            stderr,
        }
    }

    /// Waits (bounded) until the follower has printed receipt `seq` of `scope`.
    fn wait_for(&mut self, scope: &str, seq: u64) {
        let key = (scope.to_owned(), seq);
        while !self.seen.contains(&key) {
            match self.lines.recv_timeout(Duration::from_secs(30)) {
                Ok(k) => {
                    self.seen.insert(k);
                }
                Err(e) => {
                    let printed: Vec<_> = self.seen.iter().filter(|(s, _)| s == scope).collect();
                    panic!(
                        "warren log -f never printed {scope} #{seq}: {e}\n\
                         it printed of that scope: {printed:?}\n\
                         running: {:?}\nits stderr:\n{}",
                        self.child.try_wait(),
                        std::fs::read_to_string(self.stderr.path()).unwrap_or_default()
                    )
                }
            }
        }
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The pid of the supervisor's child running `binary` (nsd's own helpers share its binary, so
/// the parent tells the daemon apart), once there is one.
fn daemon_pid(w: &Warren, binary: &str) -> i32 {
    let supervisor = w.supervisor_pid();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let found: Vec<i32> = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| {
                let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                // Field 4 (after the parenthesised name) is the parent.
                let ppid = stat
                    .rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<i32>().ok());
                exe.file_name().is_some_and(|n| n == binary) && ppid == Some(supervisor)
            })
            .collect();
        match found.as_slice() {
            [pid] => return *pid,
            [] => assert!(
                Instant::now() < deadline,
                "no {binary} under the supervisor"
            ),
            many => panic!("{binary} more than once under the supervisor: {many:?}"),
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until `pid` is dead (reaped or a zombie).
fn wait_dead(pid: i32) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::fs::read_link(format!("/proc/{pid}/exe")).is_ok() {
        assert!(Instant::now() < deadline, "pid {pid} survived SIGKILL");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until every daemon answers 9P again (the supervisor restarted the killed one).
fn wait_all_answer(w: &Warren) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = w.run(&["status", "--json"]);
        if let Ok(v) = serde_json::from_slice::<Value>(&out.stdout)
            && v["daemons"]
                .as_array()
                .is_some_and(|d| d.iter().all(|d| d["answers"] == true))
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the daemons did not all come back: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every scope an envelope names, with the envelope.
fn check_chain(w: &Warren, scope: &str) -> Vec<Value> {
    assert!(
        w.run(&["write", "/receipts/ctl", "checkpoint"])
            .status
            .success()
    );
    let export = w.run_ok(&["receipts", "export", scope]);
    let keys = w.run(&["receipts", "keys"]);
    let dir = tempfile::tempdir().unwrap();
    let (e, k) = (dir.path().join("export"), dir.path().join("keys"));
    std::fs::write(&e, &export.stdout).unwrap();
    std::fs::write(&k, &keys.stdout).unwrap();
    let verify = w.run(&["verify", e.to_str().unwrap(), "--keys", k.to_str().unwrap()]);
    assert_eq!(
        verify.status.code(),
        Some(0),
        "the chain of {scope} does not verify: {}",
        String::from_utf8_lossy(&verify.stderr)
    );
    w.receipts(scope)
}

#[test]
fn each_daemon_killed_during_calls_comes_back_and_no_call_runs_without_a_decision() {
    let w = Warren::up();
    let mut follower = Follower::start(&w);
    let mut agent = Agent::start(&w);
    let mut outcomes: Vec<(String, Outcome)> = Vec::new();
    let ran = |o: &Outcome| matches!(o, Outcome::Envelope(v) if v["status"] == "ok");
    for daemon in ["receiptd", "gate", "toolfs", "nsd"] {
        // A working agent before each kill (the previous kill may have ended its namespace or
        // its mount: below).
        if !agent.alive() || !outcomes.last().is_some_and(|(_, o)| ran(o)) {
            agent = Agent::start(&w);
        }
        agent.send(&format!("before-{daemon}"));
        let before = agent.collect();
        assert!(
            before.iter().all(|(_, o)| ran(o)),
            "before killing {daemon}: {before:?}"
        );
        outcomes.extend(before);

        // Calls in flight while it dies.
        for i in 0..3 {
            agent.send(&format!("during-{daemon}-{i}"));
        }
        let binary = format!("warren-{daemon}");
        let old = daemon_pid(&w, &binary);
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(old), nix::sys::signal::SIGKILL).unwrap();
        wait_dead(old);
        wait_all_answer(&w);
        let new = daemon_pid(&w, &binary);
        assert_ne!(old, new, "{daemon} was not restarted");
        for i in 0..3 {
            agent.send(&format!("after-{daemon}-{i}"));
        }
        let answered = agent.collect();
        let kept_working = answered
            .iter()
            .any(|(l, o)| l.starts_with("after-") && ran(o));
        eprintln!(
            "{daemon} killed: the agent's namespace {}",
            if kept_working {
                "kept working"
            } else if agent.alive() {
                "is alive, its calls fail closed"
            } else {
                "ended"
            }
        );
        // A restart of receiptd, the gate or toolfs is invisible to the namespace beyond the
        // calls refused meanwhile: its bridges ask nsd for new connections with the same grant
        // and re-attach. nsd's death ends its namespaces (docs/gaps.md).
        if daemon != "nsd" {
            assert!(kept_working, "after {daemon} restarted: {answered:?}");
        }
        outcomes.extend(answered);

        // The daemon really serves again: a namespace started now makes a call that runs.
        let (code, out, err) = w.sh(
            &["--tool", "echo"],
            r#"exec 3<>/tool/echo/call; printf '{"text":"fresh"}' >&3; cat <&3"#,
        );
        assert_eq!(code, 0, "after {daemon}: {err}");
        let fresh: Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(fresh["status"], "ok", "after {daemon} restarted: {fresh}");
        let fresh_scope = fresh["receipt"]["scope"].as_str().unwrap();
        let receipts = check_chain(&w, fresh_scope);
        assert_eq!(receipts[0]["kind"], "decision");
        assert_eq!(receipts[0]["subject"]["verdict"], "allow");
    }
    drop(agent);

    // Every call that ran names its effect receipt (or says why it could not be written); every
    // call refused names its decision receipt, or was refused because there was nowhere to
    // write one.
    let mut scopes = std::collections::BTreeSet::new();
    for (label, o) in &outcomes {
        let Outcome::Envelope(v) = o else { continue };
        match v["status"].as_str().unwrap() {
            "ok" => {
                // echo is read-tier: its run is a query receipt (`specs/receipts.md`).
                assert_eq!(v["receipt"]["kind"], "query", "{label}: {v}");
                assert!(
                    v["receipt"]["decision"]["seq"].is_u64(),
                    "{label}: an effect receipt not named by its decision: {v}"
                );
                scopes.insert(v["receipt"]["scope"].as_str().unwrap().to_owned());
            }
            // No decision receipt only when there was no gate or no receiptd to write one.
            "denied" if v["receipt"].is_null() => {
                let basis = v["basis"].as_str().unwrap_or_default();
                assert!(
                    basis == "receipts_unavailable" || basis.starts_with("gate_unavailable"),
                    "{label}: denied without a receipt: {v}"
                )
            }
            "denied" => assert_eq!(v["receipt"]["kind"], "decision", "{label}: {v}"),
            other => panic!("{label}: unexpected status {other}: {v}"),
        }
    }
    // In the chains: every effect follows an allowing decision for the same arguments, made in
    // the same scope and named by seq.
    for scope in &scopes {
        let receipts = check_chain(&w, scope);
        // `warren log -f`, started before any kill, printed every one of them.
        for r in &receipts {
            follower.wait_for(scope, r["seq"].as_u64().unwrap());
        }
        for r in receipts
            .iter()
            .filter(|r| r["kind"] == "effect" || r["kind"] == "query")
        {
            let seq = r["subject"]["decision"]["seq"]
                .as_u64()
                .unwrap_or_else(|| panic!("an effect without its decision: {r}"));
            let decision = &receipts[seq as usize];
            assert!(seq < r["seq"].as_u64().unwrap());
            assert_eq!(decision["kind"], "decision", "{decision}");
            assert_eq!(decision["subject"]["verdict"], "allow", "{decision}");
            assert_eq!(
                args_hex(decision),
                args_hex(r),
                "the decision was for other arguments"
            );
        }
        // The invariant itself: each call that ran was allowed by a decision receipt for its
        // exact arguments, written before it ran (the gate appends before it answers).
        let ran = outcomes.iter().filter_map(|(label, o)| match o {
            Outcome::Envelope(v)
                if v["status"] == "ok" && v["receipt"]["scope"] == scope.as_str() =>
            {
                Some(label)
            }
            _ => None,
        });
        let unallowed = ran_without_an_allow(ran, &receipts);
        assert!(
            unallowed.is_empty(),
            "calls ran without an allowing decision receipt in {scope}: {unallowed:?}"
        );
    }
    let summary: Vec<String> = outcomes
        .iter()
        .map(|(label, o)| match o {
            Outcome::Envelope(v) => format!("{label}: {}", v["status"]),
            Outcome::Failed => format!("{label}: failed"),
        })
        .collect();
    eprintln!("the agent's calls: {summary:?}");
}

/// The signals `pid` blocks (`SigBlk` of /proc/PID/status), as a mask.
fn blocked_signals(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("SigBlk:"))
        .unwrap()
        .trim();
    u64::from_str_radix(hex, 16).unwrap()
}

/// A daemon the supervisor restarted stops on SIGTERM like one it started first: nothing of the
/// supervisor's own signal handling (HUP, INT and TERM blocked for its signalfd) passes to it, so
/// `warren down` finds receiptd writing its final checkpoint and toolfs draining its receipts,
/// and kills neither.
#[test]
fn a_restarted_daemon_stops_on_sigterm() {
    let w = Warren::up();
    for daemon in ["receiptd", "toolfs"] {
        let old = daemon_pid(&w, &format!("warren-{daemon}"));
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(old), nix::sys::signal::SIGKILL).unwrap();
        wait_dead(old);
    }
    wait_all_answer(&w);
    for daemon in ["receiptd", "toolfs"] {
        let pid = daemon_pid(&w, &format!("warren-{daemon}"));
        assert_eq!(blocked_signals(pid), 0, "restarted {daemon} blocks signals");
    }
    // A call, so there is a receipt to drain and a checkpoint to write.
    let (code, out, err) = w.sh(
        &["--tool", "echo"],
        r#"exec 3<>/tool/echo/call; printf '{"text":"last"}' >&3; cat <&3"#,
    );
    assert_eq!(code, 0, "{out} {err}");
    w.run_ok(&["down"]);
    let log = std::fs::read_to_string(w.runtime().join("warren.log")).unwrap();
    let after_restart = &log[log.rfind("toolfs died").expect("toolfs was restarted")..];
    assert!(
        !after_restart.contains("ignored SIGTERM"),
        "a restarted daemon was SIGKILLed at `warren down`:\n{after_restart}"
    );
    for graceful in ["stopped after the final checkpoint", "SIGTERM: stopping"] {
        assert!(
            after_restart.contains(graceful),
            "no `{graceful}` at `warren down`:\n{after_restart}"
        );
    }
}

/// Runs `warren ARGS` and returns its output, or panics if it has not ended within 60 s (a
/// client that blocks on a daemon that is down).
fn run_bounded(w: &Warren, args: &[&str]) -> std::process::Output {
    let mut child = w
        .cmd(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("warren {args:?} blocked");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// A daemon that keeps dying is never given up on: past five restarts a minute the supervisor
/// waits longer before each try, with the daemon's sockets closed meanwhile (a client is refused
/// at once, never left waiting on a socket nobody answers); `warren status` and `warren doctor`
/// say which daemon is down and why; and it comes back.
#[test]
fn a_daemon_that_keeps_dying_is_down_for_a_while_and_then_back() {
    let w = Warren::up();
    // Deaths 6, 7 and 8 wait 1, 2 and 4 s; the 9th, 8 s.
    for _ in 0..9 {
        let pid = daemon_pid(&w, "warren-receiptd");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL).unwrap();
        wait_dead(pid);
    }
    // The supervisor notices the death (it polls) and says so.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = run_bounded(&w, &["status", "--json"]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        if v["daemons"][0]["state"] == "down" {
            break;
        }
        assert!(Instant::now() < deadline, "receiptd is not down: {v}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = run_bounded(&w, &["status"]);
    let status = String::from_utf8_lossy(&status.stdout);
    let line = status
        .lines()
        .find(|l| l.trim_start().starts_with("receiptd"))
        .unwrap_or_else(|| panic!("{status}"));
    assert!(
        line.contains("down: died 9 times in a minute, last: signal: 9 (SIGKILL)"),
        "{status}"
    );
    let doctor = run_bounded(&w, &["doctor"]);
    let doctor = String::from_utf8_lossy(&doctor.stdout);
    assert!(doctor.contains("receiptd down: died 9 times"), "{doctor}");
    // Its client is refused at once, with the socket named.
    let ls = run_bounded(&w, &["ls", "/receipts"]);
    assert!(!ls.status.success());
    assert!(
        String::from_utf8_lossy(&ls.stderr).contains("receipts.sock"),
        "{}",
        String::from_utf8_lossy(&ls.stderr)
    );
    wait_all_answer(&w);
    let ls = run_bounded(&w, &["ls", "/receipts"]);
    assert!(
        ls.status.success(),
        "{}",
        String::from_utf8_lossy(&ls.stderr)
    );
}

/// A bridge killed under a running namespace is not left behind as a mount answering ENOTCONN
/// under a namespace `warren ps` calls running: nsd ends the namespace, and its launcher and
/// `warren ps` say why.
#[test]
fn a_killed_bridge_ends_its_namespace_and_says_why() {
    let w = Warren::up();
    let mut run = w.spawn_run(&[
        "--tool",
        "echo",
        "--",
        "/bin/sh",
        "-c",
        "cat /tool/tools >/dev/null && echo served && exec sleep 1000",
    ]);
    let mut stdout = std::io::BufReader::new(run.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "served");
    let ps = w.run(&["ps"]);
    assert!(String::from_utf8_lossy(&ps.stdout).contains("sleep"));

    let bridge = w.daemon_pid("warren-bridge");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(bridge),
        nix::sys::signal::SIGKILL,
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while run.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "the namespace outlived its bridge: {}",
            String::from_utf8_lossy(&w.run(&["ps"]).stdout)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = run.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("the bridge serving /tool died (signal: 9 (SIGKILL)): namespace ended"),
        "{err}"
    );
    let ps = w.run(&["ps"]);
    assert!(
        !String::from_utf8_lossy(&ps.stdout).contains("sleep"),
        "{}",
        String::from_utf8_lossy(&ps.stdout)
    );
}
