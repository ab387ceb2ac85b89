//! What llmfs holds for a namespace is a budget of its subtree (`limit llm-bytes=`, else llmfs's
//! default of 64 MiB): a write that would pass it fails with EDQUOT and the session's `err` file
//! names the budget; a clone's bytes count against its root; another subtree is untouched; the
//! bytes are given back when the sessions end; and one request is bounded (8 MiB), so a
//! conversation cannot grow without limit.

mod common;

use std::time::Duration;

use common::{Conn, Llmfs, Script, error_of, tmp};
use serde_json::json;
use warren_9p::{Errno, oflags};
use warren_proto::lineage::{Budget, Lineage, Member};

const EDQUOT: Errno = Errno(libc::EDQUOT as u32);
const MIB: usize = 1 << 20;
/// llmfs's default budget of a subtree, in the 2 MiB sessions [`fill`] makes.
const DEFAULT_BUDGET_SESSIONS: usize = (64 << 20) / (2 * MIB);

fn member(c: char, namespace: &str, llm_bytes: Option<u64>) -> Member {
    Member {
        session: c.to_string().repeat(32),
        namespace: namespace.into(),
        budget: Budget {
            llm_bytes,
            ..Budget::default()
        },
        ..Member::default()
    }
}

/// Mints `n` sessions holding 1 MiB of `system` and 1 MiB of `tools` each (as the attack that
/// took llmfs from 7 MB to 137 MB did): their tokens.
async fn fill(conn: &Conn, n: usize) -> Vec<String> {
    let big = "x".repeat(MIB);
    let mut tokens = Vec::new();
    for i in 0..n {
        let token = conn.new_session().await;
        for file in ["system", "tools"] {
            conn.put(&token, file, &big)
                .await
                .unwrap_or_else(|e| panic!("session {i}: {file}: {e}"));
        }
        tokens.push(token);
    }
    tokens
}

/// A 1 MiB `system` in a new session: whether the subtree had room for it.
async fn one_more(conn: &Conn) -> Result<(), Errno> {
    let token = conn.new_session().await;
    conn.put(&token, "system", &"x".repeat(MIB)).await
}

/// The sessions of a closed connection are dropped once llmfs has read its end, which no reply
/// tells the client: waits (bounded) until the subtree has room again, then fills one session as
/// [`fill`] does.
async fn until_room(conn: &Conn) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let token = conn.new_session().await;
    let big = "x".repeat(MIB);
    while conn.put(&token, "system", &big).await == Err(EDQUOT) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the closed connection's bytes were never given back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    conn.put(&token, "tools", &big).await.unwrap();
}

/// (1) One namespace filling its budget is refused — the write fails with EDQUOT, `err` names
/// the budget — while another subtree on the same llmfs is served; the bytes come back when the
/// connection (and with it its sessions) ends.
#[tokio::test]
async fn a_subtree_filling_its_budget_is_refused_and_another_is_served() {
    let dir = tmp();
    let script = Script::start(dir.path(), "openai", json!([{"text": "hi"}]));
    let fs = Llmfs::start(dir.path(), script.port, "openai", &["--model", "m"]);
    let flooder = fs
        .hand_over_lineage(Lineage::root(member('a', "1", None)))
        .await;
    fill(&flooder, DEFAULT_BUDGET_SESSIONS).await;

    let token = flooder.new_session().await;
    let refused = flooder.put(&token, "system", &"x".repeat(MIB)).await;
    assert_eq!(refused, Err(EDQUOT));
    let why = flooder.get(&token, "err").await;
    assert!(
        why.starts_with("system: budget:llm_bytes: the subtree of namespace 1 holds")
            && why.contains("--subtree-mb"),
        "{why}"
    );
    assert_eq!(flooder.get(&token, "system").await, "", "nothing was kept");
    // A message being written to `ask` is held too.
    let ask = flooder.open(&token, "ask", oflags::WRONLY).await.unwrap();
    assert_eq!(ask.write_all(0, b"hello").await, Err(EDQUOT));
    assert!(
        flooder
            .get(&token, "err")
            .await
            .starts_with("ask: budget:llm_bytes:"),
        "{}",
        flooder.get(&token, "err").await
    );

    // Another subtree has its own budget.
    let other = fs
        .hand_over_lineage(Lineage::root(member('b', "2", None)))
        .await;
    let token = other.new_session().await;
    other.put(&token, "system", &"x".repeat(MIB)).await.unwrap();
    assert_eq!(other.ask(&token, "hello").await[0], json!({"text": "hi"}));
    assert_eq!(other.get(&token, "err").await, "", "nothing refused");

    // The namespace's connection ends (its sessions with it): its bytes are given back.
    drop(ask);
    drop(flooder);
    let again = fs
        .hand_over_lineage(Lineage::root(member('a', "1", None)))
        .await;
    until_room(&again).await;
    fill(&again, DEFAULT_BUDGET_SESSIONS - 1).await;
    assert_eq!(one_more(&again).await, Err(EDQUOT), "the same budget again");
}

/// (2) A clone's bytes count against its root: the root and its clone together are refused
/// at the root's budget (the clone, on a connection of its own, names the root's), and an
/// unrelated subtree is untouched.
#[tokio::test]
async fn a_clone_shares_its_roots_budget() {
    let dir = tmp();
    let script = Script::start(dir.path(), "openai", json!([]));
    let fs = Llmfs::start(dir.path(), script.port, "openai", &["--model", "m"]);
    let root = fs
        .hand_over_lineage(Lineage::root(member('a', "1", None)))
        .await;
    let clone = fs
        .hand_over_lineage(Lineage(vec![
            member('c', "3", None),
            member('a', "1", None),
        ]))
        .await;
    let half = DEFAULT_BUDGET_SESSIONS / 2;
    fill(&root, half).await;
    fill(&clone, DEFAULT_BUDGET_SESSIONS - half).await;

    let token = clone.new_session().await;
    assert_eq!(
        clone.put(&token, "tools", &"x".repeat(MIB)).await,
        Err(EDQUOT)
    );
    let why = clone.get(&token, "err").await;
    assert!(
        why.contains("budget:llm_bytes: the subtree of namespace 1 holds"),
        "the root's budget: {why}"
    );
    assert_eq!(one_more(&root).await, Err(EDQUOT));
    let other = fs
        .hand_over_lineage(Lineage::root(member('b', "2", None)))
        .await;
    one_more(&other).await.unwrap();

    // The clone's sessions end with its connection: the root has room again.
    drop(clone);
    until_room(&root).await;
}

/// A namespace's own `limit llm-bytes=` binds its subtree below its root's budget, and names
/// itself when it refuses; its root goes on being served.
#[tokio::test]
async fn a_namespaces_own_limit_binds_below_its_roots() {
    let dir = tmp();
    let script = Script::start(dir.path(), "openai", json!([]));
    let fs = Llmfs::start(dir.path(), script.port, "openai", &["--model", "m"]);
    let clone = fs
        .hand_over_lineage(Lineage(vec![
            member('c', "3", Some(4 * MIB as u64)),
            member('a', "1", None),
        ]))
        .await;
    fill(&clone, 2).await;
    let token = clone.new_session().await;
    assert_eq!(clone.put(&token, "system", "x").await, Err(EDQUOT));
    let why = clone.get(&token, "err").await;
    assert!(
        why.contains("the subtree of namespace 3 holds 4194304 bytes")
            && why.contains("limit llm-bytes="),
        "{why}"
    );
    let root = fs
        .hand_over_lineage(Lineage::root(member('a', "1", None)))
        .await;
    one_more(&root).await.unwrap();
}

/// (3) One request is bounded (8 MiB): a conversation that would need more is refused with an
/// error line saying so, nothing is sent, and the conversation is kept as it was (not grown, not
/// trimmed), so a shorter ask goes on from it.
#[tokio::test]
async fn a_conversation_past_the_request_bound_is_refused_not_grown() {
    let dir = tmp();
    let reply = "y".repeat(1_000_000);
    let script = Script::start(
        dir.path(),
        "openai",
        json!([{"text": reply}, {"text": reply}, {"text": reply}, {"text": reply},
               {"text": "short"}, {"text": "never asked"}]),
    );
    let fs = Llmfs::start(dir.path(), script.port, "openai", &["--model", "m"]);
    let conn = fs
        .hand_over_lineage(Lineage::root(member('a', "1", None)))
        .await;
    let token = conn.new_session().await;
    let message = "x".repeat(1_000_000);
    // Four turns of 1 MB each way: about 8 MB of conversation, under 8 MiB.
    for _ in 0..4 {
        let got = conn.ask(&token, &message).await;
        assert!(got.last().unwrap().get("done").is_some(), "{got:?}");
    }
    let e = error_of(&conn.ask(&token, &message).await);
    assert!(
        e.contains("more than llmfs sends in one (8388608 bytes")
            && e.contains("start a new session"),
        "{e}"
    );
    assert_eq!(script.requests().len(), 4, "the refused ask was not sent");

    let got = conn.ask(&token, "short one").await;
    assert_eq!(got[0], json!({"text": "short"}));
    let sent = script.requests();
    let messages = sent[4]["body"]["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 9, "the eight kept and the new one");
    assert_eq!(messages[8], json!({"role": "user", "content": "short one"}));
}
