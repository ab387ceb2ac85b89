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
use reqwest::StatusCode;
use reqwest::header::{HeaderMap, HeaderValue};
use serde::Serialize;
use serde_json::{Value, json};

mod anthropic;
mod openai;

use anthropic::{anthropic_body, anthropic_stream, anthropic_whole};
use openai::{openai_body, openai_stream, openai_whole};

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

#[cfg(test)]
mod tests {
    use super::*;

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
