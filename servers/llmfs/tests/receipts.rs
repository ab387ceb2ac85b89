//! A model call is receipted in receiptd: the model, the token counts and digests of what was
//! sent and what came back, never the text.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{Llmfs, Script, error_of, lines, tmp};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use warren_9p::{Client, Errno, oflags};
use warren_llmfs::receipts::Receipts;
use warren_receiptd::LogConfig;
use warren_receiptd::daemon::{self, DaemonConfig};

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// The bodies of the receipts in `scope`, once it has `n` of them (receipts are written off the
/// ask's path, so they are waited for; bounded, so a missing one fails).
async fn receipts(socket: &std::path::Path, scope: &str, n: usize) -> Vec<Value> {
    let client = Client::connect_unix(socket).await.unwrap();
    let root = client.attach("op", "").await.unwrap();
    for _ in 0..500 {
        if let Ok(fid) = root.walk(&[scope, "log"]).await {
            fid.open(oflags::RDONLY).await.unwrap();
            let log = fid.read_to_end(0).await.unwrap();
            let bodies = warren_test_support::receipts::bodies_of(&log);
            if bodies.len() >= n {
                return bodies;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("scope {scope} did not get {n} receipts");
}

/// receiptd on `<base>/run/receipts.sock`, in a thread of the test (it runs until the test
/// process ends); returns its socket once it accepts.
fn start_receiptd(base: &Path) -> std::path::PathBuf {
    let run = base.join("run");
    std::fs::create_dir_all(&run).unwrap();
    let receipts_socket = run.join("receipts.sock");
    let mut log = LogConfig::new(&base.join("data"), &base.join("rsecrets"));
    log.min_free_bytes = 0;
    let config = DaemonConfig {
        log,
        socket: receipts_socket.clone(),
        control: None,
        daemons: Default::default(),
    };
    // receiptd in a thread of the test (it runs until the test process ends).
    std::thread::spawn(move || daemon::run(config).expect("receiptd"));
    for _ in 0..1000 {
        if std::os::unix::net::UnixStream::connect(&receipts_socket).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    receipts_socket
}

/// The scripted backend with `turns`, and llmfs in front of it (model `gpt-test`) receipting in
/// the receiptd on `receipts_socket`; `gated`: as it runs by default, else `--no-gate`.
fn receipted_llmfs(
    dir: &Path,
    receipts_socket: &Path,
    turns: Value,
    gated: bool,
) -> (Script, Llmfs) {
    let script = Script::start(dir, "openai", turns);
    let socket = receipts_socket.to_str().unwrap();
    let mut args = vec!["--model", "gpt-test", "--receipts", socket];
    if !gated {
        args.push("--no-gate");
    }
    let fs = Llmfs::start_with(dir, script.port, "openai", &args);
    (script, fs)
}

#[tokio::test]
async fn a_model_call_is_receipted_with_digests_not_text() {
    let dir = tmp();
    let receipts_socket = start_receiptd(dir.path());
    let (script, fs) = receipted_llmfs(
        dir.path(),
        &receipts_socket,
        json!([{"chunks": ["The secret ", "is safe."],
                "usage": {"prompt_tokens": 21, "completion_tokens": 6}}]),
        true,
    );
    let conn = fs.connect().await;
    let token = conn.new_session().await;
    let reply = conn.ask(&token, "tell me the secret").await;
    assert!(reply.last().unwrap().get("done").is_some(), "{reply:?}");

    let scope = warren_llmfs::session::scope_of(&token);
    let bodies = receipts(&receipts_socket, &scope, 1).await;
    let call = bodies
        .iter()
        .find(|b| b["kind"] == "query")
        .expect("a query receipt");
    assert_eq!(
        call["subject"],
        json!({"server": "llmfs", "api": "openai", "model": "gpt-test",
               "prompt_tokens": 21, "completion_tokens": 6})
    );
    let sent = serde_json::to_vec(&script.requests()[0]["body"]).unwrap();
    let answer = json!({"role": "assistant", "content": "The secret is safe."});
    assert_eq!(
        call["digests"],
        json!({"request": sha256(&sent),
               "reply": sha256(&serde_json::to_vec(&answer).unwrap())})
    );
    let text = serde_json::to_string(&bodies).unwrap();
    for secret in ["tell me the secret", "is safe", &token] {
        assert!(!text.contains(secret), "{secret:?} is in a receipt");
    }
}

/// A connection nsd hands over for a namespace (`llmfs.ctl`, `mount llm`): its model calls are
/// receipted in the namespace's session, not in a scope of llmfs's own.
#[tokio::test]
async fn a_namespace_connection_is_receipted_in_its_session() {
    let dir = tmp();
    let receipts_socket = start_receiptd(dir.path());
    let (_script, fs) = receipted_llmfs(
        dir.path(),
        &receipts_socket,
        json!([{"text": "hello", "usage": {"prompt_tokens": 2, "completion_tokens": 1}}]),
        false,
    );
    let session = "5e55105e55105e55105e55105e55105e";
    let conn = fs.hand_over(session).await;
    let token = conn.new_session().await;
    let reply = conn.ask(&token, "hi").await;
    assert!(reply.last().unwrap().get("done").is_some(), "{reply:?}");
    let bodies = receipts(&receipts_socket, session, 1).await;
    let call = bodies
        .iter()
        .find(|b| b["kind"] == "query")
        .expect("a query receipt in the namespace's session");
    assert_eq!(call["subject"]["model"], "gpt-test");
    // The session minted on the operator socket is not visible on the namespace's connection.
    let op = fs.connect().await;
    let theirs = op.new_session().await;
    assert!(conn.root.walk(&[theirs.as_str()]).await.is_err());
}

/// A model's name is the one text a namespace writes that goes whole into its calls' `query`
/// receipts (and the gate's decide requests): it is refused when written unless it is at most
/// 256 bytes of `[A-Za-z0-9._:/@-]` — a 70 KiB name, which receiptd would refuse for good in a
/// receipt (64 KiB limit), is EFBIG, a name with other characters EINVAL — so one namespace's
/// name never makes a receipt no one can write, and other namespaces' calls go on being answered.
#[tokio::test]
async fn a_model_name_is_bounded_when_written_and_other_namespaces_go_on_being_answered() {
    let dir = tmp();
    let receipts_socket = start_receiptd(dir.path());
    let (_script, fs) = receipted_llmfs(
        dir.path(),
        &receipts_socket,
        json!([{"text": "one"}, {"text": "two"}, {"text": "three"}]),
        false,
    );
    let attacker = fs.hand_over("a77ac0e5a77ac0e5a77ac0e5a77ac0e5").await;
    let token = attacker.new_session().await;
    assert_eq!(
        attacker.put(&token, "model", &"m".repeat(70 * 1024)).await,
        Err(Errno::EFBIG)
    );
    assert_eq!(
        attacker.put(&token, "model", "gpt 4\u{0}").await,
        Err(Errno::EINVAL)
    );
    assert_eq!(attacker.get(&token, "model").await, "gpt-test");
    let longest = format!("{}\n", "m".repeat(255));
    attacker.put(&token, "model", &longest).await.unwrap();
    let reply = attacker.ask(&token, "hi").await;
    assert!(reply.last().unwrap().get("done").is_some(), "{reply:?}");
    let victim = fs.hand_over("b1c7b1c7b1c7b1c7b1c7b1c7b1c7b1c7").await;
    let t = victim.new_session().await;
    attacker
        .put(&token, "model", "org/model-1.5:q4@2024_01")
        .await
        .unwrap();
    let reply = victim.ask(&t, "hello").await;
    assert!(reply.last().unwrap().get("done").is_some(), "{reply:?}");
    let bodies = receipts(&receipts_socket, "a77ac0e5a77ac0e5a77ac0e5a77ac0e5", 1).await;
    assert_eq!(bodies[0]["subject"]["model"], "m".repeat(255));
    receipts(&receipts_socket, "b1c7b1c7b1c7b1c7b1c7b1c7b1c7b1c7", 1).await;
}

/// A receipt receiptd refuses for good (here invalid: over its 64 KiB request limit) is dropped
/// and logged by llmfs's receipt writer, not retried forever: the receipts queued behind it are
/// written, and asks go on getting a place in the queue.
#[tokio::test]
async fn a_receipt_receiptd_refuses_for_good_is_dropped_and_the_queue_goes_on() {
    let dir = tmp();
    let receipts_socket = start_receiptd(dir.path());
    let queue = Receipts::start(receipts_socket.clone());
    let subject = |model: String| {
        json!({"scope": "0123456789abcdef0123456789abcdef", "kind": "query",
               "subject": {"server": "llmfs", "api": "openai", "model": model,
                           "prompt_tokens": 1, "completion_tokens": 1},
               "digests": {"request": sha256(b"q"), "reply": sha256(b"a")}})
    };
    queue
        .reserve()
        .unwrap()
        .send(subject("m".repeat(70 * 1024)));
    queue.reserve().unwrap().send(subject("after".into()));
    let bodies = receipts(&receipts_socket, "0123456789abcdef0123456789abcdef", 1).await;
    assert_eq!(bodies.len(), 1, "{bodies:?}");
    assert_eq!(bodies[0]["subject"]["model"], "after");
    assert!(queue.reserve().is_ok());
}

/// Each connection (a namespace's share) has at most 16 asks running at once — each holds a place
/// in llmfs's receipt queue, shared by every namespace, from its decision to its answer. Four
/// connections of one subtree (a namespace and three clones, each `mount llm`, 256 sessions
/// each) starting 1024 slow asks get 16 running each and the rest refused with an error line, and
/// another namespace's call still reaches the model.
#[tokio::test]
async fn one_subtrees_asks_in_flight_are_capped_and_leave_other_namespaces_answered() {
    let dir = tmp();
    let receipts_socket = start_receiptd(dir.path());
    let mut turns: Vec<Value> = (0..1024)
        .map(|_| json!({"text": "slow", "delay_ms": 60_000}))
        .collect();
    turns.push(json!({"text": "victim"}));
    let (script, fs) = receipted_llmfs(dir.path(), &receipts_socket, Value::Array(turns), false);
    let mut conns = Vec::new();
    for i in 0..4 {
        let conn = fs
            .hand_over(&format!("a77ac0e5a77ac0e5a77ac0e5a77ac0e{i}"))
            .await;
        let mut tokens = Vec::new();
        for _ in 0..256 {
            let token = conn.new_session().await;
            // `echo hi > ask`: written and clunked, the ask starts.
            let fid = conn.open(&token, "ask", oflags::WRONLY).await.unwrap();
            fid.write_all(0, b"hi").await.unwrap();
            fid.clunk().await.unwrap();
            tokens.push(token);
        }
        conns.push((conn, tokens));
    }
    // Every running ask is at the model (it holds its queue place) before the other one asks.
    wait_for("the running asks to reach the model", || {
        script.requests().len() >= 64
    })
    .await;
    let victim = fs.hand_over("b1c7b1c7b1c7b1c7b1c7b1c7b1c7b1c7").await;
    let t = victim.new_session().await;
    let fid = victim.open(&t, "ask", oflags::WRONLY).await.unwrap();
    fid.write_all(0, b"hello").await.unwrap();
    fid.clunk().await.unwrap();
    wait_for("another namespace's call to reach the model", || {
        script
            .requests()
            .iter()
            .any(|r| r["body"]["messages"][0]["content"] == "hello")
    })
    .await;
    assert_eq!(script.requests().len(), 65);
    // The connection's 17th ask ended at once, refused: only this connection's asks wait.
    let (conn, tokens) = &conns[0];
    let fid = conn.open(&tokens[16], "ask", oflags::RDONLY).await.unwrap();
    let refused = lines(&fid.read_to_end(0).await.unwrap());
    assert!(
        error_of(&refused).contains("16 asks running"),
        "{refused:?}"
    );
}

/// Waits (bounded: a condition never met fails) until `done`.
async fn wait_for(what: &str, done: impl Fn() -> bool) {
    for _ in 0..500 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("waited in vain for {what}");
}
