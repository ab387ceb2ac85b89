//! llmfs against the scripted backend, both as processes, over 9P: replies, streaming, tool
//! calls, retries, every failure ending in one error line, and sessions private to their
//! connection.

mod common;

use common::{KEY, Llmfs, Script, error_of, tmp};
use serde_json::{Value, json};
use warren_9p::{Errno, oflags};

fn texts(reply: &[Value]) -> Vec<&str> {
    reply.iter().filter_map(|l| l["text"].as_str()).collect()
}

#[tokio::test]
async fn a_plain_reply_and_what_was_sent() {
    let dir = tmp();
    let script = Script::start(dir.path(), "openai", json!([{"text": "Hello there."}]));
    let fs = Llmfs::start(dir.path(), script.port, "openai", &[]);
    let conn = fs.connect().await;
    let token = conn.new_session().await;
    assert_eq!(token.len(), 32, "128 bits in hex: {token}");
    assert!(token.bytes().all(|b| b.is_ascii_hexdigit()));
    conn.put(&token, "model", "gpt-test\n").await.unwrap();
    conn.put(&token, "system", "Be brief.").await.unwrap();
    let reply = conn.ask(&token, "hi\n").await;
    assert_eq!(texts(&reply), ["Hello there."]);
    assert_eq!(reply.last().unwrap()["done"]["finish_reason"], "stop");

    let sent = script.requests();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0]["authorization"], format!("Bearer {KEY}"));
    let body = &sent[0]["body"];
    assert_eq!(body["model"], "gpt-test");
    assert_eq!(body["stream"], true);
    assert_eq!(
        body["messages"],
        json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}])
    );
}

/// Each delta is its own line, in order; the next ask carries the conversation so far.
#[tokio::test]
async fn a_streamed_reply_arrives_as_lines_and_the_conversation_goes_on() {
    let dir = tmp();
    let script = Script::start(
        dir.path(),
        "openai",
        json!([{"chunks": ["Hel", "lo, ", "world"]}, {"text": "Again."}]),
    );
    let fs = Llmfs::start(dir.path(), script.port, "openai", &["--model", "m1"]);
    let conn = fs.connect().await;
    let token = conn.new_session().await;
    let reply = conn.ask(&token, "greet").await;
    assert_eq!(texts(&reply), ["Hel", "lo, ", "world"]);
    assert_eq!(reply.len(), 4, "three deltas and the end: {reply:?}");
    assert!(reply[3].get("done").is_some(), "{reply:?}");

    let again = conn.ask(&token, "once more").await;
    assert_eq!(texts(&again), ["Again."]);
    let sent = script.requests();
    assert_eq!(sent[1]["body"]["model"], "m1");
    assert_eq!(
        sent[1]["body"]["messages"],
        json!([
            {"role": "user", "content": "greet"},
            {"role": "assistant", "content": "Hello, world"},
            {"role": "user", "content": "once more"},
        ])
    );
}

/// A tool call arrives whole (its arguments came in two pieces); the tool's result, written as a
/// JSON message, continues the conversation.
#[tokio::test]
async fn a_tool_call_and_its_result() {
    let dir = tmp();
    let script = Script::start(
        dir.path(),
        "openai",
        json!([
            {"tool_calls": [{"id": "call_1", "name": "get_weather",
                             "arguments": {"city": "Paris"}}]},
            {"text": "Sunny in Paris."},
        ]),
    );
    let fs = Llmfs::start(dir.path(), script.port, "openai", &["--model", "m"]);
    let conn = fs.connect().await;
    let token = conn.new_session().await;
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    conn.put(&token, "tools", &tools.to_string()).await.unwrap();
    let reply = conn.ask(&token, "weather in Paris?").await;
    assert_eq!(
        reply[0],
        json!({"tool_call": {"id": "call_1", "name": "get_weather",
                             "arguments": "{\"city\":\"Paris\"}"}})
    );
    assert_eq!(reply.last().unwrap()["done"]["finish_reason"], "tool_calls");
    let result = json!({"role": "tool", "tool_call_id": "call_1", "content": "sunny"});
    let reply = conn.ask(&token, &result.to_string()).await;
    assert_eq!(texts(&reply), ["Sunny in Paris."]);

    let sent = script.requests();
    assert_eq!(sent[0]["body"]["tools"], tools);
    let messages = &sent[1]["body"]["messages"];
    assert_eq!(
        messages[1]["tool_calls"][0]["function"],
        json!({"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"})
    );
    assert_eq!(messages[2], result);
}

#[tokio::test]
async fn a_429_is_retried_after_its_retry_after() {
    let dir = tmp();
    let script = Script::start(
        dir.path(),
        "openai",
        json!([{"status": 429, "retry_after": 1, "error": "slow down"}, {"text": "ok"}]),
    );
    let fs = Llmfs::start(dir.path(), script.port, "openai", &["--model", "m"]);
    let conn = fs.connect().await;
    let token = conn.new_session().await;
    let reply = conn.ask(&token, "hi").await;
    assert_eq!(texts(&reply), ["ok"]);
    assert_eq!(script.requests().len(), 2, "asked again after the 429");
}

#[tokio::test]
async fn a_persistent_500_ends_in_one_clear_error_line() {
    let dir = tmp();
    let fault = json!({"status": 500, "error": "upstream exploded"});
    let script = Script::start(dir.path(), "openai", json!([fault, fault, fault, fault]));
    let fs = Llmfs::start(
        dir.path(),
        script.port,
        "openai",
        &["--model", "m", "--tries", "3"],
    );
    let conn = fs.connect().await;
    let token = conn.new_session().await;
    let reply = conn.ask(&token, "hi").await;
    assert_eq!(reply.len(), 1, "{reply:?}");
    let e = error_of(&reply);
    assert!(
        e.contains("HTTP 500") && e.contains("3 tries") && e.contains("upstream exploded"),
        "{e}"
    );
    assert_eq!(script.requests().len(), 3);
}

/// A backend slower than the session's timeout: the ask ends with an error, it does not hang.
#[tokio::test]
async fn a_reply_slower_than_the_timeout_ends_in_an_error() {
    let dir = tmp();
    let script = Script::start(
        dir.path(),
        "openai",
        json!([{"delay_ms": 600_000, "text": "too late"}]),
    );
    let fs = Llmfs::start(dir.path(), script.port, "openai", &["--model", "m"]);
    let conn = fs.connect().await;
    let token = conn.new_session().await;
    conn.put(&token, "ctl", "timeout 1\n").await.unwrap();
    assert!(conn.get(&token, "ctl").await.contains("timeout 1\n"));
    let reply = conn.ask(&token, "hi").await;
    let e = error_of(&reply);
    assert!(e.contains("timeout") && e.contains("1s"), "{e}");
    assert_eq!(texts(&reply), Vec::<&str>::new());
}

#[tokio::test]
async fn a_malformed_or_broken_off_reply_ends_in_an_error() {
    let dir = tmp();
    let script = Script::start(
        dir.path(),
        "openai",
        json!([{"malformed": true}, {"chunks": ["a", "b", "c"], "close_after": 2}]),
    );
    let fs = Llmfs::start(dir.path(), script.port, "openai", &["--model", "m"]);
    let conn = fs.connect().await;
    let token = conn.new_session().await;
    let e = error_of(&conn.ask(&token, "hi").await);
    assert!(e.contains("malformed reply"), "{e}");
    let reply = conn.ask(&token, "hi").await;
    let e = error_of(&reply);
    assert!(e.contains("broke off"), "{e}");
    assert_eq!(texts(&reply), ["a"], "what came before the break is kept");
    assert_eq!(script.requests().len(), 2, "neither is retried");
}

/// A 401 says the key was refused and where it came from, never the key; a 404 names the model.
#[tokio::test]
async fn a_bad_key_and_an_unknown_model_are_named() {
    let dir = tmp();
    let script = Script::start(
        dir.path(),
        "openai",
        json!([{"status": 401, "error": "invalid api key"},
               {"status": 404, "error": "The model `nope` does not exist"}]),
    );
    let fs = Llmfs::start(dir.path(), script.port, "openai", &["--model", "nope"]);
    let conn = fs.connect().await;
    let token = conn.new_session().await;
    let e = error_of(&conn.ask(&token, "hi").await);
    assert!(
        e.contains("refused the API key") && e.contains("llm.key") && !e.contains(KEY),
        "{e}"
    );
    let e = error_of(&conn.ask(&token, "hi").await);
    assert!(e.contains("\"nope\" not found"), "{e}");
    assert_eq!(script.requests().len(), 2, "neither is retried");
}

/// A failed ask leaves no trace in the conversation: asking again does not send the message
/// twice.
#[tokio::test]
async fn a_failed_ask_is_not_kept_in_the_conversation() {
    let dir = tmp();
    let script = Script::start(
        dir.path(),
        "openai",
        json!([{"status": 400, "error": "bad"}, {"text": "fine"}]),
    );
    let fs = Llmfs::start(dir.path(), script.port, "openai", &["--model", "m"]);
    let conn = fs.connect().await;
    let token = conn.new_session().await;
    let e = error_of(&conn.ask(&token, "first").await);
    assert!(e.contains("HTTP 400"), "{e}");
    conn.ask(&token, "second").await;
    assert_eq!(
        script.requests()[1]["body"]["messages"],
        json!([{"role": "user", "content": "second"}])
    );
}

/// A session belongs to the connection that minted it: on another it does not exist.
#[tokio::test]
async fn another_connection_cannot_open_a_token() {
    let dir = tmp();
    let script = Script::start(dir.path(), "openai", json!([]));
    let fs = Llmfs::start(dir.path(), script.port, "openai", &[]);
    let mine = fs.connect().await;
    let token = mine.new_session().await;
    mine.put(&token, "model", "m").await.unwrap();
    let theirs = fs.connect().await;
    for file in ["model", "ask", "usage"] {
        let walked = theirs.root.walk(&[token.as_str(), file]).await;
        assert_eq!(walked.err(), Some(Errno::ENOENT), "{file}");
    }
    assert_eq!(theirs.root.walk(&[&token]).await.err(), Some(Errno::ENOENT));
    let listing = theirs.root.walk(&[]).await.unwrap();
    listing.open(oflags::RDONLY).await.unwrap();
    let names: Vec<String> = listing.read_dir_names().await.unwrap();
    assert!(!names.contains(&token), "{names:?}");
    // Its owner still sees it.
    assert_eq!(mine.get(&token, "model").await, "m");
}

#[tokio::test]
async fn usage_adds_up_what_the_backend_reported() {
    let dir = tmp();
    let script = Script::start(
        dir.path(),
        "openai",
        json!([
            {"text": "one", "usage": {"prompt_tokens": 3, "completion_tokens": 5}},
            {"text": "two", "usage": {"prompt_tokens": 7, "completion_tokens": 11}},
        ]),
    );
    let fs = Llmfs::start(dir.path(), script.port, "openai", &["--model", "m"]);
    let conn = fs.connect().await;
    let token = conn.new_session().await;
    let reply = conn.ask(&token, "a").await;
    assert_eq!(
        reply.last().unwrap()["done"]["usage"],
        json!({"prompt_tokens": 3, "completion_tokens": 5})
    );
    conn.ask(&token, "b").await;
    let usage: Value = serde_json::from_str(&conn.get(&token, "usage").await).unwrap();
    assert_eq!(
        usage,
        json!({"prompt_tokens": 10, "completion_tokens": 16, "total_tokens": 26})
    );
    assert_eq!(
        script.requests()[0]["body"]["stream_options"],
        json!({"include_usage": true})
    );
}

/// `echo … > ask` then `cat ask`: the message written on one open and closed, the reply read on
/// another.
#[tokio::test]
async fn an_ask_written_on_one_open_is_read_on_another() {
    let dir = tmp();
    let script = Script::start(dir.path(), "openai", json!([{"text": "pong"}]));
    let fs = Llmfs::start(dir.path(), script.port, "openai", &["--model", "m"]);
    let conn = fs.connect().await;
    let token = conn.new_session().await;
    let writer = conn.open(&token, "ask", oflags::WRONLY).await.unwrap();
    writer.write_all(0, b"ping\n").await.unwrap();
    writer.clunk().await.unwrap();
    let reader = conn.open(&token, "ask", oflags::RDONLY).await.unwrap();
    let reply = common::lines(&reader.read_to_end(0).await.unwrap());
    assert_eq!(texts(&reply), ["pong"]);
}

/// The Anthropic Messages API against the scripted backend in its Anthropic mode: the key and
/// version headers, the system prompt at the top, the required max_tokens, text and a tool call.
#[tokio::test]
async fn the_anthropic_api_gives_text_a_tool_call_and_usage() {
    let dir = tmp();
    let script = Script::start(
        dir.path(),
        "anthropic",
        json!([{"chunks": ["Let me ", "look."],
                "tool_calls": [{"id": "toolu_1", "name": "get_weather",
                                "arguments": {"city": "Oslo"}}],
                "usage": {"prompt_tokens": 12, "completion_tokens": 9}}]),
    );
    let fs = Llmfs::start(
        dir.path(),
        script.port,
        "anthropic",
        &["--model", "claude-test"],
    );
    let conn = fs.connect().await;
    let token = conn.new_session().await;
    conn.put(&token, "system", "Be brief.").await.unwrap();
    let reply = conn.ask(&token, "weather in Oslo?").await;
    assert_eq!(texts(&reply), ["Let me ", "look."]);
    assert_eq!(
        reply[2],
        json!({"tool_call": {"id": "toolu_1", "name": "get_weather",
                             "arguments": "{\"city\":\"Oslo\"}"}})
    );
    let done = &reply[3]["done"];
    assert_eq!(done["finish_reason"], "tool_use");
    assert_eq!(
        done["usage"],
        json!({"prompt_tokens": 12, "completion_tokens": 9})
    );
    let sent = &script.requests()[0];
    assert_eq!(sent["x_api_key"], KEY);
    assert_eq!(sent["authorization"], Value::Null);
    assert_eq!(sent["anthropic_version"], "2023-06-01");
    assert_eq!(sent["body"]["system"], "Be brief.");
    assert_eq!(sent["body"]["max_tokens"], 4096);
    assert_eq!(
        sent["body"]["messages"],
        json!([{"role": "user", "content": "weather in Oslo?"}])
    );
}

/// Reading `ask` before anything was asked is the end of an empty reply, not a wait for an ask
/// that may never come.
#[tokio::test]
async fn reading_ask_before_any_ask_is_an_empty_reply() {
    let dir = tmp();
    let script = Script::start(dir.path(), "openai", json!([]));
    let fs = Llmfs::start(dir.path(), script.port, "openai", &["--model", "m"]);
    let conn = fs.connect().await;
    let token = conn.new_session().await;
    let reader = conn.open(&token, "ask", oflags::RDONLY).await.unwrap();
    let read = tokio::time::timeout(std::time::Duration::from_secs(10), reader.read_to_end(0))
        .await
        .expect("a read of ask with no ask ends");
    assert_eq!(read.unwrap(), b"");
    assert!(script.requests().is_empty());
}

/// The reply is read as it arrives: with the backend stalled after its first piece, a read
/// returns that piece (it cannot have waited for the end, which never comes); the ask then ends
/// at its timeout. While it runs, a second ask in the session is EBUSY.
#[tokio::test]
async fn a_read_returns_what_arrived_before_the_reply_ends() {
    let dir = tmp();
    let script = Script::start(
        dir.path(),
        "openai",
        json!([{"chunks": ["first", "never sent"], "stall_after": 2}]),
    );
    let fs = Llmfs::start(dir.path(), script.port, "openai", &["--model", "m"]);
    let conn = fs.connect().await;
    let token = conn.new_session().await;
    conn.put(&token, "ctl", "timeout 2").await.unwrap();
    let fid = conn.open(&token, "ask", oflags::RDWR).await.unwrap();
    fid.write_all(0, b"hi").await.unwrap();
    let first = fid.read(0, 4096).await.unwrap();
    assert_eq!(first, b"{\"text\":\"first\"}\n");

    let other = conn.open(&token, "ask", oflags::RDWR).await.unwrap();
    other.write_all(0, b"meanwhile").await.unwrap();
    assert_eq!(other.read(0, 4096).await.err(), Some(Errno::EBUSY));

    let rest = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        fid.read_to_end(first.len() as u64),
    )
    .await
    .expect("the ask ends at its timeout")
    .unwrap();
    let e = error_of(&common::lines(&rest));
    assert!(e.contains("timeout"), "{e}");
    assert_eq!(script.requests().len(), 1, "the second ask was not sent");
}

/// An open that read its reply does not run on into the next open's reply: it has reached its
/// end, and stays there.
#[tokio::test]
async fn an_open_that_read_its_reply_does_not_read_the_next_one() {
    let dir = tmp();
    let script = Script::start(
        dir.path(),
        "openai",
        json!([{"text": "one"}, {"text": "two"}]),
    );
    let fs = Llmfs::start(dir.path(), script.port, "openai", &["--model", "m"]);
    let conn = fs.connect().await;
    let token = conn.new_session().await;
    let first = conn.open(&token, "ask", oflags::RDWR).await.unwrap();
    first.write_all(0, b"a").await.unwrap();
    let read = first.read_to_end(0).await.unwrap();
    assert_eq!(texts(&common::lines(&read)), ["one"]);
    assert_eq!(texts(&conn.ask(&token, "b").await), ["two"]);
    assert_eq!(first.read(read.len() as u64, 4096).await.unwrap(), b"");
}

/// A 429 whose `Retry-After` reaches past the ask's timeout ends the ask at once, saying it was
/// rate limited, instead of waiting out the timeout and blaming the clock.
#[tokio::test]
async fn a_retry_after_past_the_timeout_ends_the_ask_as_rate_limited() {
    let dir = tmp();
    let script = Script::start(
        dir.path(),
        "openai",
        json!([{"status": 429, "retry_after": 3600, "error": "quota"}, {"text": "late"}]),
    );
    let fs = Llmfs::start(dir.path(), script.port, "openai", &["--model", "m"]);
    let conn = fs.connect().await;
    let token = conn.new_session().await;
    conn.put(&token, "ctl", "timeout 30").await.unwrap();
    let e = error_of(&conn.ask(&token, "hi").await);
    assert!(e.contains("HTTP 429") && e.contains("quota"), "{e}");
    assert_eq!(script.requests().len(), 1);
}

/// A read blocked on a stalled reply can be flushed (the client gave up on it); the ask goes on,
/// and the next read on the same open gets the rest.
#[tokio::test]
async fn a_flushed_read_leaves_the_ask_running_for_the_next_read() {
    let dir = tmp();
    let script = Script::start(
        dir.path(),
        "openai",
        json!([{"chunks": ["first", "never sent"], "stall_after": 2}]),
    );
    let fs = Llmfs::start(dir.path(), script.port, "openai", &["--model", "m"]);
    let conn = fs.connect().await;
    let token = conn.new_session().await;
    conn.put(&token, "ctl", "timeout 5").await.unwrap();
    let fid = conn.open(&token, "ask", oflags::RDWR).await.unwrap();
    fid.write_all(0, b"hi").await.unwrap();
    let first = fid.read(0, 4096).await.unwrap();
    // The backend sends nothing more until the ask's timeout: this read waits, and is dropped
    // (the client sends Tflush).
    let waiting = tokio::time::timeout(
        std::time::Duration::from_millis(200),
        fid.read(first.len() as u64, 4096),
    )
    .await;
    assert!(waiting.is_err(), "nothing more arrived: {waiting:?}");
    let rest = fid.read_to_end(first.len() as u64).await.unwrap();
    let e = error_of(&common::lines(&rest));
    assert!(e.contains("timeout"), "{e}");
}

/// A connection holds at most 256 sessions: one more `new` is EAGAIN, not unbounded memory.
#[tokio::test]
async fn sessions_per_connection_are_capped() {
    let dir = tmp();
    let script = Script::start(dir.path(), "openai", json!([]));
    let fs = Llmfs::start(dir.path(), script.port, "openai", &[]);
    let conn = fs.connect().await;
    let mut tokens = std::collections::HashSet::new();
    for _ in 0..warren_llmfs::tree::MAX_SESSIONS {
        tokens.insert(conn.new_session().await);
    }
    assert_eq!(
        tokens.len(),
        warren_llmfs::tree::MAX_SESSIONS,
        "all distinct"
    );
    let new = conn.root.walk(&["new"]).await.unwrap();
    assert_eq!(new.open(oflags::RDONLY).await.err(), Some(Errno::EAGAIN));
    // Another connection has its own.
    fs.connect().await.new_session().await;
}

/// A backend that is not there: tried again, then one clear error line.
#[tokio::test]
async fn an_unreachable_backend_ends_in_one_clear_error_line() {
    let dir = tmp();
    // A port that was just listened on and is closed now.
    let port = Script::start(dir.path(), "openai", json!([])).port;
    let fs = Llmfs::start(
        dir.path(),
        port,
        "openai",
        &["--model", "m", "--tries", "2"],
    );
    let conn = fs.connect().await;
    let token = conn.new_session().await;
    let reply = conn.ask(&token, "hi").await;
    assert_eq!(reply.len(), 1, "{reply:?}");
    let e = error_of(&reply);
    assert!(e.contains("cannot reach the backend after 2 tries"), "{e}");
}
