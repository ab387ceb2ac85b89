//! A model call is receipted in receiptd: the model, the token counts and digests of what was
//! sent and what came back, never the text.

mod common;

use std::time::Duration;

use base64::Engine;
use common::{Llmfs, Script, tmp};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use warren_9p::{Client, oflags};
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
            let bodies: Vec<Value> = log
                .split(|b| *b == b'\n')
                .filter(|l| !l.is_empty())
                .map(|l| {
                    let env: Value = serde_json::from_slice(l).unwrap();
                    let payload = base64::engine::general_purpose::STANDARD
                        .decode(env["payload"].as_str().unwrap())
                        .unwrap();
                    serde_json::from_slice(&payload).unwrap()
                })
                .collect();
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
fn start_receiptd(base: &std::path::Path) -> std::path::PathBuf {
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

#[tokio::test]
async fn a_model_call_is_receipted_with_digests_not_text() {
    let dir = tmp();
    let receipts_socket = start_receiptd(dir.path());
    let script = Script::start(
        dir.path(),
        "openai",
        json!([{"chunks": ["The secret ", "is safe."],
                "usage": {"prompt_tokens": 21, "completion_tokens": 6}}]),
    );
    let socket = receipts_socket.to_str().unwrap();
    let fs = Llmfs::start_with(
        dir.path(),
        script.port,
        "openai",
        &["--model", "gpt-test", "--receipts", socket],
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
    let script = Script::start(
        dir.path(),
        "openai",
        json!([{"text": "hello", "usage": {"prompt_tokens": 2, "completion_tokens": 1}}]),
    );
    let socket = receipts_socket.to_str().unwrap();
    let fs = Llmfs::start_with(
        dir.path(),
        script.port,
        "openai",
        &["--model", "gpt-test", "--receipts", socket, "--no-gate"],
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
