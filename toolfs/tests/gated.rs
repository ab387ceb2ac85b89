//! Every call crosses the gate and every effect lands as a receipt: the real warren-receiptd,
//! warren-gate (under a uid of its own) and warren-toolfs, toolfs's gate connection handed over
//! on `gate.ctl` as the supervisor hands it (a socketpair; toolfs inherits its end under
//! `WARREN_GATE_FD`).
//!
//! Why one file: one harness of real receiptd, gate and toolfs; each test is one rule of a gated
//! call.

mod common;

use std::time::Duration;

use common::stack::{answer, open_asks};
use common::*;
use serde_json::Value;
use warren_9p::Fid;
use warren_toolfs::{Envelope, Status};

fn receipt_seq(env: &Envelope, kind: &str) -> u64 {
    let r = env
        .receipt
        .as_ref()
        .unwrap_or_else(|| panic!("no receipt: {env:?}"));
    assert_eq!(r.kind, kind, "{env:?}");
    r.seq.unwrap_or_else(|| panic!("no seq: {env:?}"))
}

/// The receipt of kind `kind` (`query` for a read-tier tool, else `effect`) a call's envelope
/// names: queued, found in the scope by the decision that allowed the call once the writer has
/// appended it (waited for, up to 10 s). Returns its body and the signatures of its envelope.
async fn ran_receipt(d: &Daemon, env: &Envelope, kind: &str) -> (Value, Vec<Value>) {
    let r = env
        .receipt
        .as_ref()
        .unwrap_or_else(|| panic!("no receipt: {env:?}"));
    assert_eq!(r.kind, kind, "{env:?}");
    let decision = r
        .decision
        .as_ref()
        .expect("a queued effect names its decision");
    for _ in 0..1000 {
        let bodies = d.stack().receipts(&r.scope).await;
        if let Some(b) = bodies
            .iter()
            .find(|b| b["kind"] == kind && b["subject"]["decision"]["seq"] == decision.seq)
        {
            assert_eq!(b["subject"]["decision"]["hash"], decision.hash.as_str());
            let seq = b["seq"].as_u64().unwrap() as usize;
            let envelope = &d.stack().envelopes(&r.scope).await[seq];
            let signatures = envelope["signatures"].as_array().unwrap().clone();
            return (b.clone(), signatures);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no {kind} receipt for decision #{} written", decision.seq)
}

fn body_at(bodies: &[Value], seq: u64) -> &Value {
    bodies
        .iter()
        .find(|b| b["seq"] == seq)
        .unwrap_or_else(|| panic!("no receipt at seq {seq} in {bodies:#?}"))
}

/// The one open ask of the gate, once there is one (toolfs has decided and is waiting on it).
async fn the_open_ask(gate: &Fid) -> i64 {
    for _ in 0..1000 {
        if let [id] = open_asks(gate).await[..] {
            return id;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no single open ask: {:?}", open_asks(gate).await);
}

async fn request_text(gate: &Fid, id: i64) -> String {
    String::from_utf8(read_file(gate, &format!("pending/{id}/request")).await).unwrap()
}

fn field<'a>(request: &'a str, name: &str) -> &'a str {
    request
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name} in {request}"))
}

/// Design "How a tool call flows": a read-tier call is allowed, its decision receipt is in
/// receiptd's log before the receipt of its run, and the envelope names that (queued) receipt
/// by its decision; its digests are those of the arguments and of the result. Design
/// "Receipts": a read-tier call's run is a `query` receipt, chained unsigned (a signed
/// checkpoint covers it); the decision is signed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_call_is_decided_run_and_receipted_in_that_order() {
    let d = Daemon::start_gated(&[]);
    let rec = record(&["echo"]);
    let (_c, root) = d.granted(&rec, &[]).await;
    let args = br#"{"message":"hi"}"#;
    let env = call_envelope(&root, "echo", args).await;
    assert_eq!(env.status, Status::Ok, "{env:?}");
    let r = env.receipt.as_ref().unwrap();
    assert_eq!(r.scope, rec.session);
    let (effect, signatures) = ran_receipt(&d, &env, "query").await;
    assert!(
        signatures.is_empty(),
        "a signed query receipt: {signatures:?}"
    );
    let effect_seq = effect["seq"].as_u64().unwrap();
    let bodies = d.stack().receipts(&rec.session).await;
    assert_eq!(effect["appender"], "toolfs");
    assert_eq!(effect["subject"]["tool"], "echo");
    assert_eq!(effect["digests"]["result"], env.digest.as_str());
    assert_eq!(effect["digests"]["args"], digest(args).as_str());
    let decision_seq = effect["subject"]["decision"]["seq"].as_u64().unwrap();
    assert!(decision_seq < effect_seq, "{bodies:#?}");
    let decision = body_at(&bodies, decision_seq);
    assert_eq!(decision["kind"], "decision");
    let envelopes = d.stack().envelopes(&rec.session).await;
    assert_eq!(
        envelopes[decision_seq as usize]["signatures"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(decision["appender"], "gate");
    assert_eq!(decision["subject"]["tool"], "echo");
    assert_eq!(decision["subject"]["verdict"], "allow");
    assert_eq!(
        decision["subject"]["fingerprint"],
        effect["subject"]["fingerprint"]
    );
    assert_eq!(d.journal().len(), 2, "{:?}", d.journal());
}

/// A session granted `shell` over a fresh writable root: its connection, root fid, the root's
/// host path and the session id.
async fn writable_shell(d: &Daemon) -> (warren_9p::Client, Fid, std::path::PathBuf, String) {
    let (path, fd) = tool_root(d, "work");
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let mut rec = record_with_root(&["shell"], path_str(&path));
    rec.tools[0].roots[0].writable = true;
    let (c, root) = d.granted(&rec, &[std::os::fd::AsFd::as_fd(&fd)]).await;
    (c, root, path, rec.session)
}

/// An exec-tier call blocks until the operator answers `allow once <fp-prefix>`, then runs; an
/// identical call asks again (the token was spent) with `untrusted_context` (the session has
/// been handed a tool's result); `deny` returns a denied envelope and the tool does not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_call_waits_for_its_answer_and_a_deny_never_runs() {
    let d = Daemon::start_gated(&[]);
    let (_c, root, path, _) = writable_shell(&d).await;
    let root = std::sync::Arc::new(root);
    let gate = d.stack().gate_operator().await;
    let args = br#"{"command":"echo ran >> ran.txt"}"#;

    let first = shell_call_in_background(&root, args);
    let id = the_open_ask(&gate).await;
    let req = request_text(&gate, id).await;
    assert_eq!(field(&req, "tool"), "shell");
    assert_eq!(field(&req, "context"), "-");
    assert!(
        !first.is_finished(),
        "the call returned before its ask was answered"
    );
    assert!(
        !path.join("ran.txt").exists(),
        "the command ran before it was allowed"
    );
    answer(
        &gate,
        id,
        &format!("allow once {}", field(&req, "fingerprint")),
    )
    .await
    .unwrap();
    let env = first.await.unwrap();
    assert_eq!(env.status, Status::Ok, "{env:?}");
    // Not read-tier: the run is an `effect` receipt, signed on its own.
    let (_, signatures) = ran_receipt(&d, &env, "effect").await;
    assert_eq!(signatures.len(), 1, "{signatures:?}");
    assert_eq!(
        std::fs::read_to_string(path.join("ran.txt")).unwrap(),
        "ran\n"
    );

    let second = shell_call_in_background(&root, args);
    let id2 = the_open_ask(&gate).await;
    assert_ne!(id2, id);
    let req2 = request_text(&gate, id2).await;
    assert_eq!(field(&req2, "context"), "untrusted_context", "{req2}");
    answer(&gate, id2, "deny").await.unwrap();
    let env = second.await.unwrap();
    assert_eq!(env.status, Status::Denied, "{env:?}");
    // Words for the caller, the basis for a program.
    assert_eq!(
        env.content, "denied: an identical call was denied earlier in this session",
        "{env:?}"
    );
    assert_eq!(env.basis.as_deref(), Some("deny_covers:1"), "{env:?}");
    receipt_seq(&env, "decision");
    assert_eq!(
        std::fs::read_to_string(path.join("ran.txt")).unwrap(),
        "ran\n",
        "a denied call ran"
    );
}

/// Tflush of a read waiting on an ask withdraws the call: the gate's ask is closed (no longer
/// listed) and a `withdrawn` receipt is appended; the tool never runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_wait_withdraws_the_ask() {
    let d = Daemon::start_gated(&[]);
    let (_c, root, path, session) = writable_shell(&d).await;
    let root = std::sync::Arc::new(root);
    let gate = d.stack().gate_operator().await;
    let pending = shell_call_in_background(&root, br#"{"command":"touch ran"}"#);
    let id = the_open_ask(&gate).await;
    // The ask is listed a moment before toolfs has its id: flush once toolfs says it waits.
    for _ in 0..1000 {
        if d.log().contains("call waits for its ask to be answered") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Dropping the read's future sends Tflush for it.
    pending.abort();
    for _ in 0..1000 {
        let withdrawn = d
            .stack()
            .receipts(&session)
            .await
            .into_iter()
            .any(|b| b["kind"] == "withdrawn" && b["subject"]["pending"] == id);
        if withdrawn && open_asks(&gate).await.is_empty() {
            let req = request_text(&gate, id).await;
            assert_eq!(field(&req, "state"), "orphaned", "{req}");
            assert!(!path.join("ran").exists());
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "the ask was not withdrawn; receipts {:#?}",
        d.stack().receipts(&session).await
    );
}

/// Tflush of a read while the gate is still making its ask (its id not yet back at toolfs)
/// withdraws that ask, and the `withdrawn` receipt names it; the tool never runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_flushed_while_the_gate_asks_withdraws_that_ask_by_its_id() {
    let d = Daemon::start_gated(&[]);
    let (_c, root, path, session) = writable_shell(&d).await;
    let root = std::sync::Arc::new(root);
    let gate = d.stack().gate_operator().await;
    let pending = shell_call_in_background(&root, br#"{"command":"touch ran"}"#);
    // Flushed as soon as the gate lists the ask: toolfs may not have its id yet.
    let id = the_open_ask(&gate).await;
    pending.abort();
    for _ in 0..1000 {
        let receipts = d.stack().receipts(&session).await;
        let withdrawn: Vec<_> = receipts
            .iter()
            .filter(|b| b["kind"] == "withdrawn")
            .collect();
        if let [w] = withdrawn[..]
            && open_asks(&gate).await.is_empty()
        {
            assert_eq!(w["subject"]["pending"], id, "{receipts:#?}");
            assert!(!path.join("ran").exists());
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "the ask was not withdrawn; receipts {:#?}",
        d.stack().receipts(&session).await
    );
}

/// Fail closed: once the gate is gone, every call is denied (never run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_gate_killed_every_later_call_is_denied() {
    let mut d = Daemon::start_gated(&[]);
    let (_c, root) = d.granted(&record(&["echo"]), &[]).await;
    let env = call_envelope(&root, "echo", br#"{"n":1}"#).await;
    assert_eq!(env.status, Status::Ok, "{env:?}");
    d.stack_mut().kill_gate();
    for n in 2..4 {
        let env = call_envelope(&root, "echo", format!(r#"{{"n":{n}}}"#).as_bytes()).await;
        assert_eq!(env.status, Status::Denied, "{env:?}");
        assert!(
            env.basis
                .as_deref()
                .unwrap()
                .starts_with("gate_unavailable"),
            "{env:?}"
        );
        assert!(
            env.content
                .starts_with("denied: the gate cannot be reached")
        );
    }
    assert_eq!(d.journal().len(), 2, "{:?}", d.journal());
}

/// Without WARREN_GATE_FD every call is denied, and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_gate_every_call_is_denied() {
    let d = Daemon::start_ungated(&[]);
    let (_c, root) = d.granted(&record(&["echo"]), &[]).await;
    let env = call_envelope(&root, "echo", br#"{"n":1}"#).await;
    assert_eq!(env.status, Status::Denied, "{env:?}");
    assert_eq!(
        env.basis.as_deref(),
        Some(warren_proto::gate::client::NO_GATE)
    );
    assert_eq!(env.receipt, None);
    let (_c, op) = d.operator().await;
    let env = call_envelope(&op, "echo", br#"{"n":2}"#).await;
    assert_eq!(env.status, Status::Denied, "{env:?}");
    assert!(d.journal().is_empty(), "{:?}", d.journal());
}

/// The gate receipts every decision before answering: with receiptd down it denies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_receiptd_down_the_gate_denies() {
    let mut d = Daemon::start_gated(&[]);
    d.stack_mut().kill_receiptd();
    let (_c, root) = d.granted(&record(&["echo"]), &[]).await;
    let env = call_envelope(&root, "echo", br#"{"n":1}"#).await;
    assert_eq!(env.status, Status::Denied, "{env:?}");
    assert_eq!(
        env.basis.as_deref(),
        Some("receipts_unavailable"),
        "{env:?}"
    );
    assert!(d.journal().is_empty(), "{:?}", d.journal());
}

/// The operator socket's calls cross the gate too, in a session minted per connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_connections_are_gated_in_sessions_of_their_own() {
    let d = Daemon::start_gated(&[]);
    let (_c1, op1) = d.operator().await;
    let (_c2, op2) = d.operator().await;
    let a = call_envelope(&op1, "echo", br#"{"n":1}"#).await;
    let b = call_envelope(&op2, "echo", br#"{"n":2}"#).await;
    let (ra, rb) = (a.receipt.clone().unwrap(), b.receipt.clone().unwrap());
    assert_eq!(ra.kind, "query");
    assert_eq!(ra.scope.len(), 32);
    assert_ne!(ra.scope, rb.scope);
    let bodies = d.stack().receipts(&ra.scope).await;
    assert!(
        bodies
            .iter()
            .any(|b| b["kind"] == "decision" && b["subject"]["tool"] == "echo"),
        "{bodies:#?}"
    );
}

/// A granted writable `shell` whose every ask an operator allows at once: its runs are `effect`
/// receipts, which receiptd takes from toolfs's uid alone (read-tier runs are `query` receipts,
/// which operators may append too, specs/receipts.md §6).
/// Returns the connection, its root and the file each run appends a line to.
async fn auto_allowed_shell(d: &Daemon) -> (warren_9p::Client, Fid, std::path::PathBuf) {
    let (c, root, path, _) = writable_shell(d).await;
    d.stack().approve_every_ask();
    (c, root, path.join("ran.txt"))
}

fn shell_args(n: u32) -> Vec<u8> {
    format!(r#"{{"command":"echo {n} >> ran.txt"}}"#).into_bytes()
}

fn lines(path: &std::path::Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |t| t.lines().count())
}

/// Effect receipts are queued off the call's path and never dropped. receiptd here refuses
/// toolfs's effect receipts (it expects them from another uid) while it takes the gate's
/// decisions: the call that ran returns at once with its effect queued; the writer retries; the
/// queue fails closed, so the next call is refused (`receipts_unavailable`, after an allowing
/// decision) and does not run. Once a receiptd that takes them is back, the queued receipt is
/// written and calls run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_effect_receipt_receiptd_refuses_is_retried_and_calls_are_refused_meanwhile() {
    let mut d = Daemon::start_gated_in(temp_dir(), &["--toolfs-uid", "4242"], &[]);
    let (_c, root, ran_txt) = auto_allowed_shell(&d).await;
    let first = call_envelope(&root, "shell", &shell_args(1)).await;
    assert_eq!(first.status, Status::Ok, "{first:?}");
    let r = first.receipt.as_ref().unwrap();
    assert!(r.decision.is_some(), "{first:?}");

    let mut ran = 1;
    let mut refused = None;
    for n in 2..200 {
        let env = call_envelope(&root, "shell", &shell_args(n)).await;
        if env.status == Status::Ok {
            ran += 1;
        }
        if env.status == Status::Denied {
            refused = Some(env);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let refused = refused.expect("calls kept running while effect receipts were not written");
    assert_eq!(
        refused.basis.as_deref(),
        Some("receipts_unavailable"),
        "{refused:?}"
    );
    assert_eq!(refused.receipt.as_ref().unwrap().kind, "decision");
    let runs_then = lines(&ran_txt);
    assert!(
        d.log().contains("receipts not written, retrying"),
        "{}",
        d.log()
    );

    d.stack_mut().kill_receiptd();
    d.stack_mut().start_receiptd(&[]);
    ran_receipt(&d, &first, "effect").await;
    let mut again = None;
    for n in 1000..1200 {
        let env = call_envelope(&root, "shell", &shell_args(n)).await;
        if env.status == Status::Ok {
            again = Some(env);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let again = again.expect("calls stayed refused after receiptd took effect receipts again");
    ran_receipt(&d, &again, "effect").await;
    // The refused call did not run; every call that ran has its effect receipt, none dropped.
    assert_eq!(runs_then, ran);
    let bodies = d.stack().receipts(&r.scope).await;
    let runs = bodies.iter().filter(|b| b["kind"] == "effect").count();
    assert_eq!(runs, ran + 1, "{bodies:#?}");
}

/// A stopping toolfs writes what it queued before it goes. receiptd refuses toolfs's receipts
/// (it expects them from another uid), so the call's effect stays queued; toolfs gets SIGTERM and
/// keeps draining; a receiptd that takes them comes back within the drain's 5 s: the effect is in
/// the chain, and then toolfs exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_toolfs_writes_its_queued_receipts_first() {
    let mut d = Daemon::start_gated_in(temp_dir(), &["--toolfs-uid", "4242"], &[]);
    let (_c, root, ran_txt) = auto_allowed_shell(&d).await;
    let env = call_envelope(&root, "shell", &shell_args(1)).await;
    assert_eq!(env.status, Status::Ok, "{env:?}");
    assert_eq!(lines(&ran_txt), 1);
    for _ in 0..500 {
        if d.log().contains("receipts not written, retrying") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(d.pid() as i32),
        nix::sys::signal::SIGTERM,
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        d.is_running(),
        "toolfs left at SIGTERM with a receipt queued:\n{}",
        d.log()
    );
    d.stack_mut().kill_receiptd();
    d.stack_mut().start_receiptd(&[]);
    ran_receipt(&d, &env, "effect").await;
    for _ in 0..500 {
        if !d.is_running() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("toolfs did not exit once its queue was written");
}

/// A call closed before its first read is withdrawn: never decided, never run, receipted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_closed_before_its_read_is_receipted_withdrawn() {
    let d = Daemon::start_gated(&[]);
    let rec = record(&["echo"]);
    let (_c, root) = d.granted(&rec, &[]).await;
    let args = br#"{"n":1}"#;
    let fid = open_call(&root, "echo").await;
    fid.write(0, args).await.unwrap();
    fid.clunk().await.unwrap();
    for _ in 0..1000 {
        let bodies = d.stack().receipts(&rec.session).await;
        if let Some(w) = bodies.iter().find(|b| b["kind"] == "withdrawn") {
            assert_eq!(w["subject"]["tool"], "echo");
            assert_eq!(w["subject"]["why"], "closed before its first read");
            assert_eq!(w["digests"]["args"], digest(args).as_str());
            assert!(
                !bodies.iter().any(|b| b["kind"] == "decision"),
                "{bodies:#?}"
            );
            assert!(d.journal().is_empty(), "{:?}", d.journal());
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no withdrawn receipt");
}

/// A worker must never hold toolfs's gate connection (with it, a tool could decide, wait and
/// withdraw as toolfs): no fd of any worker names the gate socket toolfs inherited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_worker_holds_the_gate_connection() {
    let d = Daemon::start();
    let gate_fd = d.gate_fd.expect("a gated toolfs");
    let gate_sock = std::fs::read_link(format!("/proc/{}/fd/{gate_fd}", d.pid())).unwrap();
    assert!(
        gate_sock.to_string_lossy().starts_with("socket:"),
        "{gate_sock:?}"
    );
    let (path, fd) = tool_root(&d, "work");
    let rec = record_with_root(&["shell", "fs_read"], path_str(&path));
    let fds = [std::os::fd::AsFd::as_fd(&fd), std::os::fd::AsFd::as_fd(&fd)];
    let (_c, root) = d.granted(&rec, &fds).await;
    for (tool, args) in [
        ("shell", &br#"{"command":"true"}"#[..]),
        ("fs_read", br#"{"path":"none"}"#),
    ] {
        let env = call_envelope(&root, tool, args).await;
        assert!(env.receipt.is_some(), "{tool} did not run: {env:?}");
    }
    let workers = d.workers();
    assert_eq!(workers.len(), 2, "one worker per tool: {workers:?}");
    for pid in workers {
        for entry in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap() {
            let link = std::fs::read_link(entry.unwrap().path()).unwrap_or_default();
            assert_ne!(link, gate_sock, "worker {pid} holds the gate connection");
        }
    }
}

/// Bytes sent to `pid` and not yet read, over all its Unix sockets (`ss`'s Recv-Q).
fn unread_bytes(pid: u32) -> u64 {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let link = std::fs::read_link(e.path()).ok()?;
            let link = link.to_str()?;
            Some(link.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
        })
        .collect();
    let out = std::process::Command::new("ss")
        .args(["-xnH"])
        .output()
        .expect("ss (iproute2) is needed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // netid state recv-q send-q local-address local-inode peer-address peer-inode
            (f.len() >= 6 && inodes.iter().any(|i| i == f[5])).then(|| f[2].parse::<u64>().ok())?
        })
        .sum()
}

/// A gate that dies after its `allow` reached receiptd and before it answered leaves an allow
/// for a call that never ran: toolfs, denying the call `gate_unavailable`, appends a
/// `withdrawn` receipt naming the call's tool and arguments, so the chain says it never ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allow_the_gate_never_answered_is_followed_by_a_withdrawn_receipt() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let mut d = Daemon::start_gated(&[]);
    let rec = record(&["echo"]);
    let (_c, root) = d.granted(&rec, &[]).await;
    // A first call makes the gate's connection to receiptd; its own receipts are written.
    let env = call_envelope(&root, "echo", br#"{"n":1}"#).await;
    assert_eq!(env.status, Status::Ok, "{env:?}");
    ran_receipt(&d, &env, "query").await;

    let receiptd = Pid::from_raw(d.stack().receiptd_pid().unwrap() as i32);
    kill(receiptd, Signal::SIGSTOP).unwrap();
    let args = br#"{"n":2}"#;
    let call = tokio::spawn(async move { call_envelope(&root, "echo", args).await });
    // The gate's append of its `allow` waits, unread, in receiptd's socket. The gate is stopped
    // there, receiptd takes the append, and the gate is killed before it reads the ack: the
    // allow is in the chain and the call was never answered.
    for _ in 0..1000 {
        if unread_bytes(receiptd.as_raw() as u32) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        unread_bytes(receiptd.as_raw() as u32) > 0,
        "the gate sent no append"
    );
    let gate = Pid::from_raw(d.stack().gate_pid().unwrap() as i32);
    kill(gate, Signal::SIGSTOP).unwrap();
    kill(receiptd, Signal::SIGCONT).unwrap();
    let bare = digest(args).trim_start_matches("sha256:").to_owned();
    let is_the_allow = |b: &Value| {
        b["kind"] == "decision"
            && b["subject"]["verdict"] == "allow"
            && b["digests"]["args"] == bare.as_str()
    };
    for _ in 0..1000 {
        if d.stack()
            .receipts(&rec.session)
            .await
            .iter()
            .any(is_the_allow)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    d.stack_mut().kill_gate();
    let env = call.await.unwrap();
    assert_eq!(env.status, Status::Denied, "{env:?}");
    assert!(
        env.basis
            .as_deref()
            .is_some_and(|b| b.starts_with("gate_unavailable")),
        "{env:?}"
    );

    for _ in 0..1000 {
        let bodies = d.stack().receipts(&rec.session).await;
        let allow = bodies.iter().find(|b| is_the_allow(b));
        let withdrawn = bodies
            .iter()
            .find(|b| b["kind"] == "withdrawn" && b["digests"]["args"] == digest(args).as_str());
        if let (Some(allow), Some(withdrawn)) = (allow, withdrawn) {
            assert_eq!(withdrawn["subject"]["tool"], "echo");
            let why = withdrawn["subject"]["why"].as_str().unwrap();
            assert!(why.starts_with("gate_unavailable"), "{withdrawn}");
            assert!(allow["seq"].as_u64() < withdrawn["seq"].as_u64());
            let never_ran = !d.journal().iter().any(|l| l.ends_with(&digest(args)));
            assert!(never_ran, "{:?}", d.journal());
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "no allow followed by a withdrawn receipt: {:#?}",
        d.stack().receipts(&rec.session).await
    );
}

/// A `shell` call with `args` on its own task: its read waits on the gate's ask.
fn shell_call_in_background(
    root: &std::sync::Arc<Fid>,
    args: &'static [u8],
) -> tokio::task::JoinHandle<Envelope> {
    let root = root.clone();
    tokio::spawn(async move { call_envelope(&root, "shell", args).await })
}
