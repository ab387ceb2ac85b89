//! The model behind the files: one HTTP client for the OpenAI-compatible chat-completions API
//! (`POST {url}/v1/chat/completions`) and Anthropic's Messages API (`POST {url}/v1/messages`),
//! both streamed as server-sent events.
//!
//! A conversation is kept in the chat-completions message shape (`role`, `content`,
//! `tool_calls`, `tool_call_id`); the Anthropic request is translated from it. An ask is tried
//! again, with exponential backoff (or the server's `Retry-After`), on 429, 5xx and a failed
//! connection, as long as nothing of the reply was passed on yet; everything else ends it with an
//! [`AskError`] whose text says what went wrong. The total time of an ask is the caller's to bound.

use std::path::{Path, PathBuf};
use std::time::Duration;

use eventsource_stream::Eventsource;
use futures_util::{Stream, StreamExt};
use reqwest::StatusCode;
use reqwest::header::{HeaderMap, HeaderValue};
use serde::Serialize;
use serde_json::{Value, json};

/// Which wire API the backend speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Api {
    /// OpenAI-compatible chat completions (OpenAI, vLLM, llama.cpp, Ollama, most gateways).
    Openai,
    /// Anthropic's Messages API.
    Anthropic,
}

impl Api {
    pub fn as_str(self) -> &'static str {
        match self {
            Api::Openai => "openai",
            Api::Anthropic => "anthropic",
        }
    }
}

/// Anthropic requires `max_tokens`; this is what is sent when the session set none.
pub const ANTHROPIC_DEFAULT_MAX_TOKENS: u32 = 4096;
const ANTHROPIC_VERSION: &str = "2023-06-01";
/// The longest wait between two tries, whatever `Retry-After` says (the ask's own timeout still
/// bounds the whole).
const RETRY_WAIT_MAX: Duration = Duration::from_secs(60);
/// Bytes of an error body quoted in an error text.
const QUOTE_MAX: usize = 300;

#[derive(Clone, Debug)]
pub struct BackendConfig {
    pub api: Api,
    /// The base URL, without `/v1/...`.
    pub url: String,
    /// The API key (never logged, never put in an error text).
    pub key: Option<String>,
    /// Where the key came from, for the text of a 401/403 (the path, never the key).
    pub key_file: Option<PathBuf>,
    /// Tries of one ask, the first included.
    pub tries: u32,
    /// The first backoff wait; each next one doubles (up to [`RETRY_WAIT_MAX`]).
    pub backoff_first: Duration,
}

impl BackendConfig {
    /// Reads the key from `path`: its content, trimmed. A missing file is no key (a local server
    /// often needs none); an unreadable or empty one is an error.
    pub fn read_key(path: &Path) -> anyhow::Result<Option<String>> {
        match std::fs::read_to_string(path) {
            Ok(s) if s.trim().is_empty() => {
                anyhow::bail!("the key file {} is empty", path.display())
            }
            Ok(s) => Ok(Some(s.trim().to_owned())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => anyhow::bail!("cannot read the key file {}: {e}", path.display()),
        }
    }
}

/// One ask: the whole conversation so far, ending with the new message.
#[derive(Clone, Debug)]
pub struct AskRequest {
    pub model: String,
    pub system: Option<String>,
    /// Tool definitions in the chat-completions function format.
    pub tools: Vec<Value>,
    pub messages: Vec<Value>,
    pub max_tokens: Option<u32>,
}

/// A piece of the reply, passed on as it arrives.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Event {
    /// A text delta.
    Text(String),
    /// A complete tool call (its arguments arrive in pieces; it is passed on when whole).
    ToolCall(ToolCall),
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as the model wrote them: a JSON text.
    pub arguments: String,
}

/// Token counts as the backend reported them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

/// The whole reply, once it ended.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reply {
    pub text: String,
    pub tool_calls: Vec<ToolCall>,
    pub finish_reason: Option<String>,
    pub usage: Usage,
}

impl Reply {
    /// The reply as the assistant message that continues the conversation.
    pub fn as_message(&self) -> Value {
        let mut m = json!({"role": "assistant", "content": self.text});
        if !self.tool_calls.is_empty() {
            m["tool_calls"] = self
                .tool_calls
                .iter()
                .map(|c| {
                    json!({"id": c.id, "type": "function",
                           "function": {"name": c.name, "arguments": c.arguments}})
                })
                .collect();
        }
        m
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AskError {
    #[error(
        "the backend refused the API key (HTTP {status}){hint}: {message}",
        hint = .key_hint
    )]
    BadKey {
        status: u16,
        key_hint: String,
        message: String,
    },
    #[error("model {model:?} not found, or no such endpoint at the backend (HTTP 404): {message}")]
    NotFound { model: String, message: String },
    #[error("the backend refused the request (HTTP {status}): {message}")]
    Refused { status: u16, message: String },
    #[error("rate limited by the backend (HTTP 429) after {}: {message}", plural(*.tries))]
    RateLimited { tries: u32, message: String },
    #[error("the backend failed (HTTP {status}) after {}: {message}", plural(*.tries))]
    ServerError {
        status: u16,
        tries: u32,
        message: String,
    },
    #[error("cannot reach the backend after {}: {message}", plural(*.tries))]
    Unreachable { tries: u32, message: String },
    #[error("no model backend is configured (WARREN_LLM_URL was not set for llmfs)")]
    NoBackend,
    #[error("malformed reply from the backend: {0}")]
    Malformed(String),
    #[error("the backend's reply broke off: {0}")]
    BrokenOff(String),
    #[error("the backend reported an error: {0}")]
    Reported(String),
    #[error("bad request: {0}")]
    BadRequest(String),
}

fn plural(tries: u32) -> String {
    if tries == 1 {
        "1 try".into()
    } else {
        format!("{tries} tries")
    }
}

pub struct Backend {
    config: BackendConfig,
    http: reqwest::Client,
}

/// What one try came to: a reply, an error worth another try (with the server's wait, if it
/// named one), or an error that ends the ask.
enum Try {
    Again {
        error: AskError,
        wait: Option<Duration>,
    },
    Final(AskError),
}

impl Backend {
    pub fn new(config: BackendConfig) -> anyhow::Result<Backend> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .user_agent(concat!("warren-llmfs/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Backend { config, http })
    }

    pub fn api(&self) -> Api {
        self.config.api
    }

    /// The request body as it is sent (also what a receipt digests).
    pub fn body(&self, req: &AskRequest) -> Result<Value, AskError> {
        match self.config.api {
            Api::Openai => Ok(openai_body(req)),
            Api::Anthropic => anthropic_body(req),
        }
    }

    /// Runs one ask: tries until a reply, an error that is not worth another try, or the tries
    /// are spent. `on_event` gets each piece of the reply as it arrives. A wait that would end
    /// past `deadline` (the ask's timeout) is not waited: the last try's error is the answer.
    pub async fn ask(
        &self,
        body: &Value,
        model: &str,
        deadline: tokio::time::Instant,
        on_event: &mut (dyn FnMut(Event) + Send),
    ) -> Result<Reply, AskError> {
        if self.config.url.is_empty() {
            return Err(AskError::NoBackend);
        }
        let tries = self.config.tries.max(1);
        let mut backoff = self.config.backoff_first;
        let mut last = None;
        for n in 1..=tries {
            match self.try_once(body, model, on_event).await {
                Ok(reply) => return Ok(reply),
                Err(Try::Final(e)) => return Err(e),
                Err(Try::Again { error, wait }) => {
                    tracing::info!(try_ = n, "backend try failed: {error}");
                    last = Some((n, error));
                    let wait = wait.unwrap_or(backoff).min(RETRY_WAIT_MAX);
                    if n == tries || tokio::time::Instant::now() + wait >= deadline {
                        break;
                    }
                    tokio::time::sleep(wait).await;
                    backoff = (backoff * 2).min(RETRY_WAIT_MAX);
                }
            }
        }
        let (made, last) = last.expect("at least one try");
        Err(match last {
            AskError::RateLimited { message, .. } => AskError::RateLimited {
                tries: made,
                message,
            },
            AskError::ServerError {
                status, message, ..
            } => AskError::ServerError {
                status,
                tries: made,
                message,
            },
            AskError::Unreachable { message, .. } => AskError::Unreachable {
                tries: made,
                message,
            },
            other => other,
        })
    }

    fn endpoint(&self) -> String {
        let base = self.config.url.trim_end_matches('/');
        match self.config.api {
            Api::Openai => format!("{base}/v1/chat/completions"),
            Api::Anthropic => format!("{base}/v1/messages"),
        }
    }

    fn headers(&self) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(key) = &self.config.key {
            let (name, value) = match self.config.api {
                Api::Openai => ("authorization", format!("Bearer {key}")),
                Api::Anthropic => ("x-api-key", key.clone()),
            };
            if let Ok(mut v) = HeaderValue::from_str(&value) {
                v.set_sensitive(true);
                h.insert(name, v);
            }
        }
        if self.config.api == Api::Anthropic {
            h.insert(
                "anthropic-version",
                HeaderValue::from_static(ANTHROPIC_VERSION),
            );
        }
        h.insert("accept", HeaderValue::from_static("text/event-stream"));
        h
    }

    async fn try_once(
        &self,
        body: &Value,
        model: &str,
        on_event: &mut (dyn FnMut(Event) + Send),
    ) -> Result<Reply, Try> {
        let response = self
            .http
            .post(self.endpoint())
            .headers(self.headers())
            .json(body)
            .send()
            .await
            .map_err(|e| Try::Again {
                error: AskError::Unreachable {
                    tries: 1,
                    message: error_chain(&e),
                },
                wait: None,
            })?;
        let status = response.status();
        if !status.is_success() {
            return Err(self.refusal(status, model, response).await);
        }
        let json_reply = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.starts_with("application/json"));
        if json_reply {
            // A server that ignored `stream: true` answered with one whole completion.
            let bytes = response.bytes().await.map_err(|e| {
                Try::Final(AskError::BrokenOff(format!(
                    "reading the body: {}",
                    error_chain(&e)
                )))
            })?;
            let value: Value = serde_json::from_slice(&bytes)
                .map_err(|e| Try::Final(AskError::Malformed(format!("not JSON: {e}"))))?;
            let reply = match self.config.api {
                Api::Openai => openai_whole(&value),
                Api::Anthropic => anthropic_whole(&value),
            }
            .map_err(Try::Final)?;
            if !reply.text.is_empty() {
                on_event(Event::Text(reply.text.clone()));
            }
            for call in &reply.tool_calls {
                on_event(Event::ToolCall(call.clone()));
            }
            return Ok(reply);
        }
        let events = response.bytes_stream().eventsource();
        match self.config.api {
            Api::Openai => openai_stream(events, on_event).await,
            Api::Anthropic => anthropic_stream(events, on_event).await,
        }
        .map_err(Try::Final)
    }

    async fn refusal(&self, status: StatusCode, model: &str, response: reqwest::Response) -> Try {
        let wait = retry_after(response.headers());
        let body = response.bytes().await.unwrap_or_default();
        let message = error_message(&body);
        let code = status.as_u16();
        match code {
            401 | 403 => Try::Final(AskError::BadKey {
                status: code,
                key_hint: match (&self.config.key, &self.config.key_file) {
                    (None, Some(p)) => format!(" (no key: {} does not exist)", p.display()),
                    (Some(_), Some(p)) => format!(" (the key in {})", p.display()),
                    _ => String::new(),
                },
                message,
            }),
            404 => Try::Final(AskError::NotFound {
                model: model.to_owned(),
                message,
            }),
            429 => Try::Again {
                error: AskError::RateLimited { tries: 1, message },
                wait,
            },
            500..=599 => Try::Again {
                error: AskError::ServerError {
                    status: code,
                    tries: 1,
                    message,
                },
                wait,
            },
            _ => Try::Final(AskError::Refused {
                status: code,
                message,
            }),
        }
    }
}

/// `retry-after-ms` (OpenAI's), else `Retry-After` in seconds; an HTTP date is not honoured
/// (the backoff applies).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let get = |name: &str| headers.get(name)?.to_str().ok()?.trim().parse::<f64>().ok();
    let valid = |v: f64| v.is_finite() && v >= 0.0;
    if let Some(ms) = get("retry-after-ms").filter(|v| valid(*v)) {
        return Some(Duration::from_secs_f64(ms / 1000.0).min(RETRY_WAIT_MAX));
    }
    get("retry-after")
        .filter(|v| valid(*v))
        .map(|s| Duration::from_secs_f64(s).min(RETRY_WAIT_MAX))
}

/// The message of an error body (`{"error":{"message":..}}` in both APIs, or `{"error":".."}`),
/// else the body itself, cut short.
fn error_message(body: &[u8]) -> String {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let found = parsed.as_ref().and_then(|v| {
        let e = v.get("error")?;
        e.get("message")
            .and_then(Value::as_str)
            .or_else(|| e.as_str())
            .map(str::to_owned)
    });
    let text = found.unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    let text = text.trim();
    if text.is_empty() {
        return "(no message)".into();
    }
    quote(text)
}

fn quote(text: &str) -> String {
    if text.len() <= QUOTE_MAX {
        return text.to_owned();
    }
    let mut end = QUOTE_MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// An error with its causes (reqwest's own text is often just "error sending request").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    s
}

fn openai_body(req: &AskRequest) -> Value {
    let mut messages = Vec::with_capacity(req.messages.len() + 1);
    if let Some(system) = &req.system {
        messages.push(json!({"role": "system", "content": system}));
    }
    messages.extend(req.messages.iter().cloned());
    let mut body = json!({
        "model": req.model,
        "messages": messages,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if !req.tools.is_empty() {
        body["tools"] = Value::Array(req.tools.clone());
    }
    if let Some(n) = req.max_tokens {
        body["max_tokens"] = json!(n);
    }
    body
}

fn anthropic_body(req: &AskRequest) -> Result<Value, AskError> {
    let mut messages: Vec<Value> = Vec::with_capacity(req.messages.len());
    for m in &req.messages {
        let converted = anthropic_message(m)?;
        // The results of one reply's several tool calls go back as one user message of
        // `tool_result` blocks, as Anthropic's API asks.
        let is_results = |v: &Value| {
            v["role"] == "user"
                && v["content"]
                    .as_array()
                    .is_some_and(|b| b.iter().all(|b| b["type"] == "tool_result"))
        };
        match messages.last_mut() {
            Some(last) if is_results(last) && is_results(&converted) => {
                let blocks = converted["content"].as_array().cloned().unwrap_or_default();
                if let Some(into) = last["content"].as_array_mut() {
                    into.extend(blocks);
                }
            }
            _ => messages.push(converted),
        }
    }
    let mut body = json!({
        "model": req.model,
        "messages": messages,
        "max_tokens": req.max_tokens.unwrap_or(ANTHROPIC_DEFAULT_MAX_TOKENS),
        "stream": true,
    });
    if let Some(system) = &req.system {
        body["system"] = json!(system);
    }
    if !req.tools.is_empty() {
        body["tools"] = req
            .tools
            .iter()
            .map(|t| {
                let f = t.get("function").unwrap_or(t);
                json!({
                    "name": f.get("name").cloned().unwrap_or(Value::Null),
                    "description": f.get("description").cloned().unwrap_or(json!("")),
                    "input_schema": f.get("parameters").cloned()
                        .unwrap_or(json!({"type": "object"})),
                })
            })
            .collect();
    }
    Ok(body)
}

/// One chat-completions message as an Anthropic one: a tool result is a user message with a
/// `tool_result` block, an assistant's tool calls are `tool_use` blocks.
fn anthropic_message(m: &Value) -> Result<Value, AskError> {
    let role = m.get("role").and_then(Value::as_str).unwrap_or("user");
    let content = m.get("content").cloned().unwrap_or(Value::Null);
    match role {
        "tool" => Ok(json!({"role": "user", "content": [{
            "type": "tool_result",
            "tool_use_id": m.get("tool_call_id").cloned().unwrap_or(Value::Null),
            "content": content,
        }]})),
        "assistant" => {
            let mut blocks = Vec::new();
            if let Some(text) = content.as_str().filter(|t| !t.is_empty()) {
                blocks.push(json!({"type": "text", "text": text}));
            }
            for call in m
                .get("tool_calls")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let f = &call["function"];
                let args = f["arguments"].as_str().unwrap_or("{}");
                let input: Value = serde_json::from_str(args).map_err(|e| {
                    AskError::BadRequest(format!("a tool call's arguments are not JSON: {e}"))
                })?;
                blocks.push(json!({"type": "tool_use", "id": call["id"],
                                   "name": f["name"], "input": input}));
            }
            Ok(json!({"role": "assistant", "content": blocks}))
        }
        "user" => Ok(json!({"role": "user", "content": content})),
        other => Err(AskError::BadRequest(format!(
            "role {other:?} has no Anthropic equivalent"
        ))),
    }
}

fn malformed(what: impl std::fmt::Display) -> AskError {
    AskError::Malformed(what.to_string())
}

fn parse_data(data: &str) -> Result<Value, AskError> {
    serde_json::from_str(data)
        .map_err(|e| malformed(format!("an event is not JSON ({e}): {}", quote(data))))
}

fn count(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

type SseResult<E> = Result<eventsource_stream::Event, eventsource_stream::EventStreamError<E>>;

async fn openai_stream<E: std::fmt::Display>(
    events: impl Stream<Item = SseResult<E>>,
    on_event: &mut (dyn FnMut(Event) + Send),
) -> Result<Reply, AskError> {
    let mut events = std::pin::pin!(events);
    let mut reply = Reply::default();
    // Tool calls by their index, filled in as their pieces arrive.
    let mut calls: Vec<ToolCall> = Vec::new();
    let mut done = false;
    while let Some(ev) = events.next().await {
        let ev = ev.map_err(|e| AskError::BrokenOff(e.to_string()))?;
        if ev.data.trim() == "[DONE]" {
            done = true;
            break;
        }
        if ev.data.trim().is_empty() {
            continue;
        }
        let chunk = parse_data(&ev.data)?;
        if let Some(e) = chunk.get("error") {
            return Err(AskError::Reported(error_message(
                &serde_json::to_vec(&json!({"error": e})).unwrap_or_default(),
            )));
        }
        if let Some(u) = chunk.get("usage").filter(|u| u.is_object()) {
            reply.usage = Usage {
                prompt_tokens: count(&u["prompt_tokens"]),
                completion_tokens: count(&u["completion_tokens"]),
            };
        }
        let Some(choices) = chunk.get("choices").and_then(Value::as_array) else {
            return Err(malformed(format!(
                "a chunk without `choices`: {}",
                quote(&ev.data)
            )));
        };
        let Some(choice) = choices.first() else {
            continue; // the usage chunk
        };
        let delta = &choice["delta"];
        if let Some(text) = delta.get("content").and_then(Value::as_str)
            && !text.is_empty()
        {
            reply.text.push_str(text);
            on_event(Event::Text(text.to_owned()));
        }
        for piece in delta
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let index = piece
                .get("index")
                .and_then(Value::as_u64)
                .map_or(calls.len().saturating_sub(1), |i| i as usize);
            if index > calls.len() + 64 {
                return Err(malformed(format!("tool call index {index}")));
            }
            if calls.len() <= index {
                calls.resize_with(index + 1, ToolCall::default);
            }
            let call = &mut calls[index];
            if let Some(id) = piece.get("id").and_then(Value::as_str) {
                call.id = id.to_owned();
            }
            let f = &piece["function"];
            if let Some(name) = f.get("name").and_then(Value::as_str) {
                call.name.push_str(name);
            }
            if let Some(args) = f.get("arguments").and_then(Value::as_str) {
                call.arguments.push_str(args);
            }
        }
        if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
            reply.finish_reason = Some(reason.to_owned());
        }
    }
    if !done && reply.finish_reason.is_none() {
        return Err(AskError::BrokenOff(
            "the stream ended before the reply was complete".into(),
        ));
    }
    finish_calls(&mut reply, calls, on_event)?;
    Ok(reply)
}

/// Checks the gathered tool calls and passes each on whole.
fn finish_calls(
    reply: &mut Reply,
    calls: Vec<ToolCall>,
    on_event: &mut (dyn FnMut(Event) + Send),
) -> Result<(), AskError> {
    for mut call in calls {
        if call.name.is_empty() {
            return Err(malformed("a tool call without a name"));
        }
        if call.arguments.trim().is_empty() {
            call.arguments = "{}".into();
        }
        if serde_json::from_str::<Value>(&call.arguments).is_err() {
            return Err(malformed(format!(
                "the arguments of tool call {:?} are not JSON: {}",
                call.name,
                quote(&call.arguments)
            )));
        }
        on_event(Event::ToolCall(call.clone()));
        reply.tool_calls.push(call);
    }
    Ok(())
}

fn openai_whole(v: &Value) -> Result<Reply, AskError> {
    let choice = v
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .ok_or_else(|| malformed("a completion without `choices`"))?;
    let message = &choice["message"];
    let mut reply = Reply {
        text: message["content"].as_str().unwrap_or_default().to_owned(),
        finish_reason: choice["finish_reason"].as_str().map(str::to_owned),
        usage: Usage {
            prompt_tokens: count(&v["usage"]["prompt_tokens"]),
            completion_tokens: count(&v["usage"]["completion_tokens"]),
        },
        ..Reply::default()
    };
    let calls = message
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|c| ToolCall {
            id: c["id"].as_str().unwrap_or_default().to_owned(),
            name: c["function"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            arguments: c["function"]["arguments"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        })
        .collect();
    finish_calls(&mut reply, calls, &mut |_| {})?;
    Ok(reply)
}

fn anthropic_whole(v: &Value) -> Result<Reply, AskError> {
    let blocks = v
        .get("content")
        .and_then(Value::as_array)
        .ok_or_else(|| malformed("a message without `content`"))?;
    let mut reply = Reply {
        finish_reason: v["stop_reason"].as_str().map(str::to_owned),
        usage: Usage {
            prompt_tokens: count(&v["usage"]["input_tokens"]),
            completion_tokens: count(&v["usage"]["output_tokens"]),
        },
        ..Reply::default()
    };
    let mut calls = Vec::new();
    for b in blocks {
        match b["type"].as_str() {
            Some("text") => reply.text.push_str(b["text"].as_str().unwrap_or_default()),
            Some("tool_use") => calls.push(ToolCall {
                id: b["id"].as_str().unwrap_or_default().to_owned(),
                name: b["name"].as_str().unwrap_or_default().to_owned(),
                arguments: b["input"].to_string(),
            }),
            _ => {}
        }
    }
    finish_calls(&mut reply, calls, &mut |_| {})?;
    Ok(reply)
}

async fn anthropic_stream<E: std::fmt::Display>(
    events: impl Stream<Item = SseResult<E>>,
    on_event: &mut (dyn FnMut(Event) + Send),
) -> Result<Reply, AskError> {
    let mut events = std::pin::pin!(events);
    let mut reply = Reply::default();
    // The tool_use block being filled, if any.
    let mut open_call: Option<ToolCall> = None;
    let mut calls = Vec::new();
    let mut stopped = false;
    while let Some(ev) = events.next().await {
        let ev = ev.map_err(|e| AskError::BrokenOff(e.to_string()))?;
        if ev.event == "ping" || ev.data.trim().is_empty() {
            continue;
        }
        let data = parse_data(&ev.data)?;
        match data["type"].as_str().unwrap_or(ev.event.as_str()) {
            "message_start" => {
                let u = &data["message"]["usage"];
                reply.usage.prompt_tokens = count(&u["input_tokens"]);
                reply.usage.completion_tokens = count(&u["output_tokens"]);
            }
            "content_block_start" => {
                let b = &data["content_block"];
                if b["type"] == "tool_use" {
                    open_call = Some(ToolCall {
                        id: b["id"].as_str().unwrap_or_default().to_owned(),
                        name: b["name"].as_str().unwrap_or_default().to_owned(),
                        arguments: String::new(),
                    });
                } else if let Some(text) = b["text"].as_str().filter(|t| !t.is_empty()) {
                    reply.text.push_str(text);
                    on_event(Event::Text(text.to_owned()));
                }
            }
            "content_block_delta" => {
                let d = &data["delta"];
                match d["type"].as_str() {
                    Some("text_delta") => {
                        let text = d["text"].as_str().unwrap_or_default();
                        if !text.is_empty() {
                            reply.text.push_str(text);
                            on_event(Event::Text(text.to_owned()));
                        }
                    }
                    Some("input_json_delta") => match &mut open_call {
                        Some(call) => {
                            call.arguments
                                .push_str(d["partial_json"].as_str().unwrap_or_default());
                        }
                        None => return Err(malformed("input_json_delta outside a tool_use block")),
                    },
                    _ => {}
                }
            }
            "content_block_stop" => calls.extend(open_call.take()),
            "message_delta" => {
                if let Some(r) = data["delta"]["stop_reason"].as_str() {
                    reply.finish_reason = Some(r.to_owned());
                }
                if let Some(n) = data["usage"]["output_tokens"].as_u64() {
                    reply.usage.completion_tokens = n;
                }
                if let Some(n) = data["usage"]["input_tokens"].as_u64() {
                    reply.usage.prompt_tokens = n;
                }
            }
            "message_stop" => {
                stopped = true;
                break;
            }
            "error" => {
                return Err(AskError::Reported(error_message(ev.data.as_bytes())));
            }
            _ => {}
        }
    }
    if !stopped {
        return Err(AskError::BrokenOff(
            "the stream ended before message_stop".into(),
        ));
    }
    finish_calls(&mut reply, calls, on_event)?;
    Ok(reply)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sse(text: &'static str) -> impl Stream<Item = SseResult<std::convert::Infallible>> {
        futures_util::stream::iter([Ok::<_, std::convert::Infallible>(text.as_bytes())])
            .eventsource()
    }

    /// An Anthropic stream as its documentation shows one: text, then a tool_use whose input
    /// arrives in pieces, then the stop and the output count.
    #[tokio::test]
    async fn an_anthropic_stream_gives_text_a_whole_tool_call_and_usage() {
        let stream = sse(concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
            "event: ping\ndata: {\"type\": \"ping\"}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Let me \"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"check.\"}}\n\n",
            "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"get_weather\",\"input\":{}}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"city\\\": \"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"\\\"Paris\\\"}\"}}\n\n",
            "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\n",
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"},\"usage\":{\"output_tokens\":40}}\n\n",
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        ));
        let mut seen = Vec::new();
        let reply = anthropic_stream(stream, &mut |e| seen.push(e))
            .await
            .unwrap();
        let call = ToolCall {
            id: "toolu_1".into(),
            name: "get_weather".into(),
            arguments: "{\"city\": \"Paris\"}".into(),
        };
        assert_eq!(
            seen,
            vec![
                Event::Text("Let me ".into()),
                Event::Text("check.".into()),
                Event::ToolCall(call.clone())
            ]
        );
        assert_eq!(reply.text, "Let me check.");
        assert_eq!(reply.tool_calls, vec![call]);
        assert_eq!(reply.finish_reason.as_deref(), Some("tool_use"));
        assert_eq!(
            reply.usage,
            Usage {
                prompt_tokens: 25,
                completion_tokens: 40
            }
        );
    }

    #[tokio::test]
    async fn an_anthropic_stream_without_message_stop_is_broken_off() {
        let stream = sse(concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{}}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n",
        ));
        let e = anthropic_stream(stream, &mut |_| {}).await.unwrap_err();
        assert!(matches!(e, AskError::BrokenOff(_)), "{e}");
    }

    /// The conversation in chat-completions shape becomes Anthropic's: the system prompt at the
    /// top, tool calls as tool_use blocks, a tool result as a user tool_result block.
    #[test]
    fn a_conversation_is_translated_to_anthropic_messages() {
        let req = AskRequest {
            model: "claude".into(),
            system: Some("be brief".into()),
            tools: vec![json!({"type": "function", "function": {
                "name": "get_weather", "description": "weather",
                "parameters": {"type": "object"}}})],
            messages: vec![
                json!({"role": "user", "content": "weather in Paris?"}),
                json!({"role": "assistant", "content": "", "tool_calls": [{"id": "c1",
                       "type": "function", "function": {"name": "get_weather",
                       "arguments": "{\"city\":\"Paris\"}"}}]}),
                json!({"role": "tool", "tool_call_id": "c1", "content": "sunny"}),
            ],
            max_tokens: None,
        };
        let body = anthropic_body(&req).unwrap();
        assert_eq!(body["system"], "be brief");
        assert_eq!(body["max_tokens"], ANTHROPIC_DEFAULT_MAX_TOKENS);
        assert_eq!(body["tools"][0]["input_schema"], json!({"type": "object"}));
        assert_eq!(
            body["messages"][1]["content"][0],
            json!({"type": "tool_use", "id": "c1", "name": "get_weather",
                   "input": {"city": "Paris"}})
        );
        assert_eq!(body["messages"][2]["role"], "user");
        assert_eq!(body["messages"][2]["content"][0]["tool_use_id"], "c1");
    }

    /// Several tool results in a row (one reply's calls, answered in one ask) are one user
    /// message of `tool_result` blocks.
    #[test]
    fn consecutive_tool_results_are_one_anthropic_message() {
        let req = AskRequest {
            model: "claude".into(),
            system: None,
            tools: vec![],
            messages: vec![
                json!({"role": "user", "content": "two things"}),
                json!({"role": "assistant", "content": "", "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                    {"id": "b", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}),
                json!({"role": "tool", "tool_call_id": "a", "content": "1"}),
                json!({"role": "tool", "tool_call_id": "b", "content": "2"}),
                json!({"role": "user", "content": "thanks"}),
            ],
            max_tokens: None,
        };
        let body = anthropic_body(&req).unwrap();
        let messages = body["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 4, "{body}");
        let ids: Vec<&Value> = messages[2]["content"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| &b["tool_use_id"])
            .collect();
        assert_eq!(ids, [&json!("a"), &json!("b")]);
        assert_eq!(messages[3], json!({"role": "user", "content": "thanks"}));
    }

    #[test]
    fn retry_after_prefers_milliseconds_and_ignores_dates() {
        let mut h = HeaderMap::new();
        h.insert("retry-after", HeaderValue::from_static("2"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(2)));
        h.insert("retry-after-ms", HeaderValue::from_static("150"));
        assert_eq!(retry_after(&h), Some(Duration::from_millis(150)));
        let mut h = HeaderMap::new();
        h.insert(
            "retry-after",
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&h), None);
    }
}
