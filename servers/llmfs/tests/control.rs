//! llmfs's control socket (`llmfs.ctl`, how nsd hands over a namespace's `mount llm`
//! connection), and llmfs with no backend configured.

mod common;

use std::os::fd::AsFd;

use common::{Llmfs, Script, error_of, tmp};
use serde_json::json;
use warren_proto::llm::{LlmGrant, hand_over};

const SESSION: &str = "0123456789abcdef0123456789abcdef";

/// A bad record and an fd that is not a socket are refused with the reason; nothing is served,
/// and the socket goes on serving sound grants.
#[tokio::test]
async fn a_bad_grant_is_refused_and_says_why() {
    let dir = tmp();
    let script = Script::start(dir.path(), "openai", json!([{"text": "hi"}]));
    let fs = Llmfs::start(dir.path(), script.port, "openai", &["--model", "m"]);
    let ctl = fs.socket.with_file_name("llmfs.ctl");
    let (_ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let bad = LlmGrant {
        version: 1,
        session: "not-a-session".into(),
        namespace: "1".into(),
        lineage: None,
    };
    let e = hand_over(&ctl, &bad, theirs.as_fd()).unwrap_err();
    assert!(
        e.to_string().contains("session must be 32 lowercase hex"),
        "{e}"
    );
    let good = LlmGrant {
        session: SESSION.into(),
        ..bad
    };
    let file = std::fs::File::open("/dev/null").unwrap();
    let e = hand_over(&ctl, &good, file.as_fd()).unwrap_err();
    assert!(e.to_string().contains("not a socket"), "{e}");
    let conn = fs.hand_over(SESSION).await;
    let token = conn.new_session().await;
    let reply = conn.ask(&token, "hello").await;
    assert_eq!(reply[0], json!({"text": "hi"}));
}

/// Started with no backend URL (as the supervisor starts it when `warren up` was given none),
/// llmfs serves its tree and every ask ends with one error line saying so.
#[tokio::test]
async fn with_no_backend_an_ask_says_none_is_configured() {
    let dir = tmp();
    let script = Script::start(dir.path(), "openai", json!([]));
    let fs = Llmfs::start(
        dir.path(),
        script.port,
        "openai",
        &["--model", "m", "--url", ""],
    );
    let conn = fs.connect().await;
    let token = conn.new_session().await;
    let reply = conn.ask(&token, "hello").await;
    assert!(
        error_of(&reply).contains("no model backend is configured"),
        "{reply:?}"
    );
    assert!(script.requests().is_empty());
}

/// Fail closed: a namespace's connection with no gate to decide its model calls (no
/// `WARREN_GATE_FD`, and not `--no-gate`) gets every ask denied, and nothing reaches the model;
/// the operator's own socket is not a namespace's and is not decided.
#[tokio::test]
async fn with_no_gate_a_namespaces_model_call_is_denied() {
    let dir = tmp();
    let script = Script::start(dir.path(), "openai", json!([{"text": "operator"}]));
    let fs = Llmfs::start_with(
        dir.path(),
        script.port,
        "openai",
        &["--model", "m", "--no-receipts"],
    );
    let conn = fs.hand_over(SESSION).await;
    let token = conn.new_session().await;
    let reply = conn.ask(&token, "hello").await;
    assert!(
        error_of(&reply).contains("the gate denied this model call: no gate"),
        "{reply:?}"
    );
    assert!(script.requests().is_empty());
    let op = fs.connect().await;
    let token = op.new_session().await;
    assert_eq!(
        op.ask(&token, "hello").await[0],
        json!({"text": "operator"})
    );
}

/// Fail closed: with a gate, a grant that does not say who the namespace is (no `lineage`) is
/// refused with the reason — its calls could be charged to no subtree's budgets — and nothing is
/// served; the same grant with its lineage is served.
#[tokio::test]
async fn with_a_gate_a_grant_without_a_lineage_is_refused() {
    let dir = tmp();
    let script = Script::start(dir.path(), "openai", json!([]));
    let fs = Llmfs::start_with(
        dir.path(),
        script.port,
        "openai",
        &["--model", "m", "--no-receipts"],
    );
    let ctl = fs.socket.with_file_name("llmfs.ctl");
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let bare = LlmGrant {
        version: 1,
        session: SESSION.into(),
        namespace: "1".into(),
        lineage: None,
    };
    let e = hand_over(&ctl, &bare, theirs.as_fd()).unwrap_err();
    assert!(e.to_string().contains("the grant has no lineage"), "{e}");
    drop(theirs);
    // Nothing serves the refused connection: the namespace's end reads EOF.
    ours.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    assert_eq!(std::io::Read::read(&mut &ours, &mut [0u8; 1]).unwrap(), 0);
    let conn = fs.hand_over(SESSION).await;
    let token = conn.new_session().await;
    let reply = conn.ask(&token, "hello").await;
    assert!(
        error_of(&reply).contains("the gate denied this model call: no gate"),
        "{reply:?}"
    );
}
