//! `warren-llm-script`: a scripted model behind the same wire interface as a hosted one — an HTTP
//! server speaking the OpenAI-compatible chat-completions API (streamed as server-sent events,
//! or whole) or Anthropic's Messages API, replaying a script of turns, one per request, in order.
//!
//! A turn is a reply (`text` or `chunks`, `tool_calls`, `usage`, `finish_reason`) or a fault
//! (`status` with `retry_after` and `error`, `malformed`, `close_after` events, `delay_ms` before
//! answering). Each request is logged as a JSON line to `--log`, so a test can assert what was
//! sent. It binds 127.0.0.1:0 and prints the port as its first line on stdout. `docs/llm.md`
//! describes the script.

use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use axum::routing::post;
use clap::Parser;
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};

#[derive(Parser, Debug)]
#[command(name = "warren-llm-script", about = "a scripted LLM backend for tests")]
struct Args {
    /// The script: a JSON list of turns (or `{"turns": [...]}`).
    #[arg(long)]
    script: PathBuf,
    /// Where each request received is logged, one JSON line each.
    #[arg(long)]
    log: PathBuf,
    /// The API it speaks.
    #[arg(long, value_enum, default_value_t = Mode::Openai)]
    api: Mode,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Mode {
    Openai,
    Anthropic,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Turn {
    /// The reply's text, in one piece.
    #[serde(default)]
    text: Option<String>,
    /// The reply's text, one event per piece.
    #[serde(default)]
    chunks: Vec<String>,
    #[serde(default)]
    tool_calls: Vec<ScriptCall>,
    #[serde(default)]
    usage: Option<ScriptUsage>,
    #[serde(default)]
    finish_reason: Option<String>,
    /// Answer with this HTTP status (and an error body) instead of a reply.
    #[serde(default)]
    status: Option<u16>,
    /// With `status`: the `Retry-After` header, in seconds.
    #[serde(default)]
    retry_after: Option<u64>,
    /// With `status`: the error message in the body.
    #[serde(default)]
    error: Option<String>,
    /// Wait this long before answering.
    #[serde(default)]
    delay_ms: u64,
    /// Answer 200 with a body that is not what the API promises.
    #[serde(default)]
    malformed: bool,
    /// Stream this many events, then cut the connection.
    #[serde(default)]
    close_after: Option<usize>,
    /// Stream this many events, then send nothing more, holding the connection open.
    #[serde(default)]
    stall_after: Option<usize>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptCall {
    id: String,
    name: String,
    /// A JSON value (sent as its text) or the text itself.
    arguments: Value,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScriptUsage {
    prompt_tokens: u64,
    completion_tokens: u64,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Script {
    Turns(Vec<Turn>),
    Wrapped { turns: Vec<Turn> },
}

struct Replay {
    mode: Mode,
    turns: Mutex<std::vec::IntoIter<Turn>>,
    served: Mutex<usize>,
    log: Mutex<std::fs::File>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let text = std::fs::read_to_string(&args.script)
        .map_err(|e| anyhow::anyhow!("{}: {e}", args.script.display()))?;
    let turns = match serde_json::from_str::<Script>(&text)
        .map_err(|e| anyhow::anyhow!("{}: {e}", args.script.display()))?
    {
        Script::Turns(t) | Script::Wrapped { turns: t } => t,
    };
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args.log)?;
    let replay = Arc::new(Replay {
        mode: args.api,
        turns: Mutex::new(turns.into_iter()),
        served: Mutex::new(0),
        log: Mutex::new(log),
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", listener.local_addr()?.port())?;
        out.flush()?;
        drop(out);
        let app = Router::new()
            .route("/v1/chat/completions", post(answer))
            .route("/v1/messages", post(answer))
            // Hosted APIs take requests of tens of MiB (axum's default is 2 MB): llmfs's own
            // bound on a request is what the tests reach.
            .layer(DefaultBodyLimit::max(32 << 20))
            .with_state(replay);
        axum::serve(listener, app).await?;
        anyhow::Ok(())
    })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

async fn answer(State(replay): State<Arc<Replay>>, headers: HeaderMap, body: Bytes) -> Response {
    let header_text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let request: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return error(StatusCode::BAD_REQUEST, &format!("body is not JSON: {e}")),
    };
    let n = {
        let mut served = lock(&replay.served);
        *served += 1;
        *served
    };
    let line = json!({
        "n": n,
        "authorization": header_text("authorization"),
        "x_api_key": header_text("x-api-key"),
        "anthropic_version": header_text("anthropic-version"),
        "body": request,
    });
    {
        let mut log = lock(&replay.log);
        let _ = writeln!(log, "{line}");
        let _ = log.flush();
    }
    let Some(mut turn) = lock(&replay.turns).next() else {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("script exhausted: request {n} has no turn"),
        );
    };
    fill_from_last_tool_result(&mut turn, &request);
    if turn.delay_ms > 0 {
        tokio::time::sleep(Duration::from_millis(turn.delay_ms)).await;
    }
    if let Some(status) = turn.status {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = error(status, turn.error.as_deref().unwrap_or("scripted failure"));
        if let Some(secs) = turn.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, secs.into());
        }
        return response;
    }
    let stream = request["stream"].as_bool().unwrap_or(false);
    if turn.malformed {
        return if stream {
            sse(
                vec!["data: {\"choices\": [ this is not json\n\n".to_owned()],
                &Turn::default(),
            )
        } else {
            respond(
                StatusCode::OK,
                "application/json",
                "{\"choices\": [ not json",
            )
        };
    }
    match (replay.mode, stream) {
        (Mode::Openai, true) => {
            let usage_wanted = request["stream_options"]["include_usage"] == true;
            sse(openai_events(&request, &turn, usage_wanted), &turn)
        }
        (Mode::Openai, false) => respond(
            StatusCode::OK,
            "application/json",
            &openai_whole(&request, &turn).to_string(),
        ),
        (Mode::Anthropic, true) => sse(anthropic_events(&request, &turn), &turn),
        (Mode::Anthropic, false) => respond(
            StatusCode::OK,
            "application/json",
            &anthropic_whole(&request, &turn).to_string(),
        ),
    }
}

fn respond(status: StatusCode, content_type: &str, body: &str) -> Response {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, content_type)
        .body(Body::from(body.to_owned()))
        .expect("response")
}

fn error(status: StatusCode, message: &str) -> Response {
    respond(
        status,
        "application/json",
        &json!({"error": {"message": message, "type": "scripted"}}).to_string(),
    )
}

/// A streamed body of these events; with the turn's `close_after`, the connection is cut after
/// that many; with `stall_after`, nothing more is sent after that many.
fn sse(events: Vec<String>, turn: &Turn) -> Response {
    let total = events.len();
    let cut = turn.close_after.is_some_and(|n| n < total);
    let stall = turn.stall_after.is_some_and(|n| n < total);
    let keep = turn
        .close_after
        .or(turn.stall_after)
        .unwrap_or(total)
        .min(total);
    let items = futures_util::stream::iter(
        events
            .into_iter()
            .take(keep)
            .map(|e| Ok::<_, std::io::Error>(Bytes::from(e)))
            .chain(cut.then(|| Err(std::io::Error::other("scripted close mid-stream")))),
    )
    .chain(futures_util::stream::pending().take(usize::from(stall)));
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        // A yield before each event: the server writes out what it has (the head and the
        // events so far) before the next, so a cut comes after them, mid-stream.
        .body(Body::from_stream(items.then(|item| async move {
            tokio::task::yield_now().await;
            item
        })))
        .expect("response")
}

fn pieces(turn: &Turn) -> Vec<String> {
    let mut out: Vec<String> = turn.text.iter().cloned().collect();
    out.extend(turn.chunks.iter().cloned());
    out
}

/// In a tool call's arguments, [`LAST_TOOL_RESULT`] stands for the content of the request's
/// last tool result: a scripted model that passes on what it read (the injection benchmark's
/// fully compromised model copies data it was given into its next call).
const LAST_TOOL_RESULT: &str = "{{last_tool_result}}";

fn fill_from_last_tool_result(turn: &mut Turn, request: &Value) {
    let last = request["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .rev()
        .find_map(|m| match m["role"].as_str() {
            Some("tool") => m["content"].as_str().map(str::to_owned),
            // Anthropic: a user message of tool_result blocks.
            Some("user") => m["content"].as_array().and_then(|blocks| {
                blocks.iter().rev().find_map(|b| {
                    (b["type"] == "tool_result")
                        .then(|| b["content"].as_str().map(str::to_owned))
                        .flatten()
                })
            }),
            _ => None,
        })
        .unwrap_or_default();
    fn fill(v: &mut Value, last: &str) {
        match v {
            Value::String(s) if s.contains(LAST_TOOL_RESULT) => {
                *s = s.replace(LAST_TOOL_RESULT, last);
            }
            Value::Array(items) => items.iter_mut().for_each(|i| fill(i, last)),
            Value::Object(m) => m.values_mut().for_each(|i| fill(i, last)),
            _ => {}
        }
    }
    for call in &mut turn.tool_calls {
        fill(&mut call.arguments, &last);
    }
}

fn arguments(call: &ScriptCall) -> String {
    match &call.arguments {
        Value::String(s) => s.clone(),
        v => v.to_string(),
    }
}

fn usage(turn: &Turn) -> ScriptUsage {
    turn.usage.unwrap_or_default()
}

fn finish_reason(turn: &Turn, tool_reason: &str, stop: &str) -> String {
    turn.finish_reason.clone().unwrap_or_else(|| {
        if turn.tool_calls.is_empty() {
            stop.into()
        } else {
            tool_reason.into()
        }
    })
}

fn openai_events(request: &Value, turn: &Turn, usage_wanted: bool) -> Vec<String> {
    let model = &request["model"];
    let chunk = |delta: Value, finish: Value| {
        format!(
            "data: {}\n\n",
            json!({"id": "chatcmpl-script", "object": "chat.completion.chunk", "model": model,
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        )
    };
    let mut events = vec![chunk(
        json!({"role": "assistant", "content": ""}),
        Value::Null,
    )];
    for piece in pieces(turn) {
        events.push(chunk(json!({"content": piece}), Value::Null));
    }
    for (i, call) in turn.tool_calls.iter().enumerate() {
        // The arguments in two pieces, as hosted models send them.
        let args = arguments(call);
        let mut half = args.len() / 2;
        while !args.is_char_boundary(half) {
            half -= 1;
        }
        events.push(chunk(
            json!({"tool_calls": [{"index": i, "id": call.id, "type": "function",
                   "function": {"name": call.name, "arguments": &args[..half]}}]}),
            Value::Null,
        ));
        events.push(chunk(
            json!({"tool_calls": [{"index": i, "function": {"arguments": &args[half..]}}]}),
            Value::Null,
        ));
    }
    events.push(chunk(
        json!({}),
        json!(finish_reason(turn, "tool_calls", "stop")),
    ));
    if usage_wanted {
        let u = usage(turn);
        events.push(format!(
            "data: {}\n\n",
            json!({"id": "chatcmpl-script", "object": "chat.completion.chunk", "model": model,
                   "choices": [], "usage": {"prompt_tokens": u.prompt_tokens,
                   "completion_tokens": u.completion_tokens,
                   "total_tokens": u.prompt_tokens + u.completion_tokens}})
        ));
    }
    events.push("data: [DONE]\n\n".into());
    events
}

fn openai_whole(request: &Value, turn: &Turn) -> Value {
    let u = usage(turn);
    let mut message = json!({"role": "assistant", "content": pieces(turn).concat()});
    if !turn.tool_calls.is_empty() {
        message["tool_calls"] = turn
            .tool_calls
            .iter()
            .map(|c| {
                json!({"id": c.id, "type": "function",
                            "function": {"name": c.name, "arguments": arguments(c)}})
            })
            .collect();
    }
    json!({
        "id": "chatcmpl-script", "object": "chat.completion", "model": request["model"],
        "choices": [{"index": 0, "message": message,
                     "finish_reason": finish_reason(turn, "tool_calls", "stop")}],
        "usage": {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
                  "total_tokens": u.prompt_tokens + u.completion_tokens},
    })
}

fn anthropic_events(request: &Value, turn: &Turn) -> Vec<String> {
    let event = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
    let u = usage(turn);
    let mut events = vec![event(
        "message_start",
        json!({"type": "message_start", "message": {"id": "msg_script", "type": "message",
               "role": "assistant", "model": request["model"], "content": [],
               "usage": {"input_tokens": u.prompt_tokens, "output_tokens": 1}}}),
    )];
    let mut index = 0;
    let text = pieces(turn);
    if !text.is_empty() {
        events.push(event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index,
                   "content_block": {"type": "text", "text": ""}}),
        ));
        events.push(event("ping", json!({"type": "ping"})));
        for piece in text {
            events.push(event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index,
                       "delta": {"type": "text_delta", "text": piece}}),
            ));
        }
        events.push(event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
        index += 1;
    }
    for call in &turn.tool_calls {
        events.push(event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index,
                   "content_block": {"type": "tool_use", "id": call.id, "name": call.name,
                                     "input": {}}}),
        ));
        events.push(event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index,
                   "delta": {"type": "input_json_delta", "partial_json": arguments(call)}}),
        ));
        events.push(event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
        index += 1;
    }
    events.push(event(
        "message_delta",
        json!({"type": "message_delta",
               "delta": {"stop_reason": finish_reason(turn, "tool_use", "end_turn")},
               "usage": {"output_tokens": u.completion_tokens}}),
    ));
    events.push(event("message_stop", json!({"type": "message_stop"})));
    events
}

fn anthropic_whole(request: &Value, turn: &Turn) -> Value {
    let u = usage(turn);
    let mut content = Vec::new();
    let text = pieces(turn).concat();
    if !text.is_empty() {
        content.push(json!({"type": "text", "text": text}));
    }
    for call in &turn.tool_calls {
        let input: Value = serde_json::from_str(&arguments(call)).unwrap_or(Value::Null);
        content.push(json!({"type": "tool_use", "id": call.id, "name": call.name, "input": input}));
    }
    json!({
        "id": "msg_script", "type": "message", "role": "assistant", "model": request["model"],
        "content": content, "stop_reason": finish_reason(turn, "tool_use", "end_turn"),
        "usage": {"input_tokens": u.prompt_tokens, "output_tokens": u.completion_tokens},
    })
}
