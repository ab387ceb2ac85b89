//! One chat session: its settings (`model`, `system`, `tools`, `ctl`), its conversation, its
//! cumulative usage, and the reply of its current ask as the JSON lines readers of `ask` see.
//!
//! An ask runs in a task of its own, so it goes on whatever happens to the read that started it
//! (a flushed or clunked fid); it ends with one `{"done":..}` or one `{"error":..}` line, and
//! always within the session's timeout. One ask at a time per session.
//!
//! Why one file: a session's files, conversation and reply are ≈ 560 lines that share one lock; the
//! rest are their tests.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::AbortHandle;

use crate::backend::{AskError, AskRequest, Backend, Event, Reply, Usage};
use crate::gate::{Admitted, ModelGate};
use crate::memory::{Account, Charge};
use crate::receipts::Receipts;

/// Bytes a settings file (`model`, `system`, `tools`) or one message may hold.
pub const MAX_FILE_BYTES: usize = 1 << 20;
/// Bytes of one ask's reply kept for its readers; past it the ask ends with an error line.
pub const MAX_REPLY_BYTES: usize = 16 << 20;
/// Bytes a model's name may have. It is the one text a namespace writes that goes whole into its
/// calls' `query` receipts and the gate's decide requests (everything else it writes goes into
/// them only as a digest), so it is held far below receiptd's request limit.
pub const MAX_MODEL_BYTES: usize = warren_gate::request::MAX_MODEL_NAME_BYTES;

/// Why a settings write is refused.
#[derive(Debug, thiserror::Error)]
pub enum SettingError {
    /// Past the file's size limit.
    #[error("{0}")]
    TooBig(String),
    /// Not a value the file takes (a model's name with other characters).
    #[error("{0}")]
    Invalid(String),
    /// Past the subtree's memory budget (`crate::memory`).
    #[error("{0}")]
    OverBudget(String),
}

/// Settings every new session starts with.
#[derive(Clone, Debug)]
pub struct Defaults {
    pub model: String,
    pub timeout: Duration,
    pub max_tokens: Option<u32>,
    /// The most bytes one request may have (its JSON body): a conversation that would need
    /// more is refused, not sent.
    pub max_request_bytes: u64,
}

/// The reply of the session's current ask, as lines, and whether it ended.
#[derive(Debug, Default)]
pub struct ReplyLines {
    /// Which ask (1, 2, ...; 0: none yet).
    pub turn: u64,
    pub bytes: Vec<u8>,
    pub done: bool,
}

struct Settings {
    model: Vec<u8>,
    system: Vec<u8>,
    tools: Vec<u8>,
    timeout: Duration,
    max_tokens: Option<u32>,
    history: Vec<Value>,
    usage: Usage,
    running: Option<AbortHandle>,
    /// `system`, `tools` and the conversation, charged to the subtree's memory budget.
    held: Charge,
}

/// A settings file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setting {
    Model,
    System,
    Tools,
}

pub struct Session {
    token: String,
    /// Where its model calls are receipted: the namespace's session when the connection was
    /// handed over for one (`llmfs.ctl`), else a scope named by a digest of the token.
    scope: String,
    settings: Mutex<Settings>,
    reply: watch::Sender<ReplyLines>,
    /// The current reply's lines, charged to the subtree's memory budget.
    reply_held: Mutex<Charge>,
    /// Its connection's memory account: an ask in flight charges its request to it.
    account: Arc<Account>,
    max_request_bytes: u64,
    /// Why the last write to one of its files was refused (the `err` file).
    refusal: Mutex<String>,
}

impl Session {
    pub fn new(token: String, defaults: &Defaults, account: Arc<Account>) -> Session {
        let scope = scope_of(&token);
        Session::in_scope(token, scope, defaults, account)
    }

    /// A session whose model calls are receipted in `scope`, its bytes charged to `account`.
    pub fn in_scope(
        token: String,
        scope: String,
        defaults: &Defaults,
        account: Arc<Account>,
    ) -> Session {
        Session {
            token,
            scope,
            reply_held: Mutex::new(Charge::new(account.clone())),
            max_request_bytes: defaults.max_request_bytes,
            refusal: Mutex::new(String::new()),
            settings: Mutex::new(Settings {
                model: defaults.model.clone().into_bytes(),
                system: Vec::new(),
                tools: Vec::new(),
                timeout: defaults.timeout,
                max_tokens: defaults.max_tokens,
                history: Vec::new(),
                usage: Usage::default(),
                running: None,
                held: Charge::new(account.clone()),
            }),
            reply: watch::Sender::new(ReplyLines::default()),
            account,
        }
    }

    /// A memory charge of this session's connection (for a message being written to `ask`).
    pub fn charge(&self) -> Charge {
        Charge::new(self.account.clone())
    }

    fn reply_held(&self) -> MutexGuard<'_, Charge> {
        self.reply_held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps why a write to one of the session's files was refused, for its `err` file.
    pub fn refused(&self, why: &str) {
        let mut line: String = why
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        line.push('\n');
        *self.refusal.lock().unwrap_or_else(|p| p.into_inner()) = line;
    }

    /// The `err` file: why the last refused write was refused (empty: none was).
    pub fn refusal_text(&self) -> String {
        self.refusal
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn token(&self) -> &str {
        &self.token
    }

    fn settings(&self) -> MutexGuard<'_, Settings> {
        self.settings.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn read_setting(&self, which: Setting) -> Vec<u8> {
        let s = self.settings();
        match which {
            Setting::Model => s.model.clone(),
            Setting::System => s.system.clone(),
            Setting::Tools => s.tools.clone(),
        }
    }

    /// A write at `offset`: the file is cut there and `data` put after it (so a write at 0
    /// replaces it, and a long value written in pieces is put together).
    pub fn write_setting(
        &self,
        which: Setting,
        offset: u64,
        data: &[u8],
    ) -> Result<(), SettingError> {
        let mut guard = self.settings();
        let s = &mut *guard;
        let file = match which {
            Setting::Model => &mut s.model,
            Setting::System => &mut s.system,
            Setting::Tools => &mut s.tools,
        };
        let at = usize::try_from(offset).unwrap_or(usize::MAX);
        if at > file.len() {
            return Err(SettingError::Invalid(format!(
                "write at {at}, past the end ({})",
                file.len()
            )));
        }
        let limit = match which {
            Setting::Model => MAX_MODEL_BYTES,
            Setting::System | Setting::Tools => MAX_FILE_BYTES,
        };
        if at + data.len() > limit {
            return Err(SettingError::TooBig(format!("more than {limit} bytes")));
        }
        if which == Setting::Model {
            let mut whole = file[..at].to_vec();
            whole.extend_from_slice(data);
            check_model(&whole).map_err(SettingError::Invalid)?;
        } else {
            // `system` and `tools` are charged; the model's name is bounded far below a budget.
            let to = s.held.bytes() - file.len() as u64 + (at + data.len()) as u64;
            s.held
                .set(to)
                .map_err(|e| SettingError::OverBudget(e.to_string()))?;
        }
        file.truncate(at);
        file.extend_from_slice(data);
        Ok(())
    }

    /// `max_tokens N` and `timeout SECS` lines (blank lines are skipped); all or nothing.
    pub fn control(&self, text: &str) -> Result<(), String> {
        let mut max_tokens = None;
        let mut timeout = None;
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let mut words = line.split_whitespace();
            let (Some(verb), Some(arg), None) = (words.next(), words.next(), words.next()) else {
                return Err(format!(
                    "{line:?}: expected `max_tokens N` or `timeout SECS`"
                ));
            };
            match verb {
                "max_tokens" => {
                    let n: u32 = arg.parse().map_err(|_| format!("max_tokens {arg:?}"))?;
                    max_tokens = Some((n > 0).then_some(n));
                }
                "timeout" => {
                    let secs: f64 = arg
                        .parse()
                        .ok()
                        .filter(|s: &f64| s.is_finite() && *s > 0.0 && *s <= 86_400.0)
                        .ok_or_else(|| format!("timeout {arg:?}: seconds, 0 < t <= 86400"))?;
                    timeout = Some(Duration::from_secs_f64(secs));
                }
                other => return Err(format!("unknown control {other:?}")),
            }
        }
        let mut s = self.settings();
        if let Some(m) = max_tokens {
            s.max_tokens = m;
        }
        if let Some(t) = timeout {
            s.timeout = t;
        }
        Ok(())
    }

    pub fn control_text(&self) -> String {
        let s = self.settings();
        format!(
            "max_tokens {}\ntimeout {}\n",
            s.max_tokens.unwrap_or(0),
            s.timeout.as_secs_f64()
        )
    }

    pub fn usage_text(&self) -> String {
        let u = self.settings().usage;
        format!(
            "{}\n",
            json!({
                "prompt_tokens": u.prompt_tokens,
                "completion_tokens": u.completion_tokens,
                "total_tokens": u.prompt_tokens + u.completion_tokens,
            })
        )
    }

    pub fn subscribe(&self) -> watch::Receiver<ReplyLines> {
        self.reply.subscribe()
    }

    /// Ends the running ask, if any (the connection went away).
    pub fn abort(&self) {
        if let Some(h) = self.settings().running.take() {
            h.abort();
        }
    }

    /// Starts an ask with `message` (the bytes written to `ask`). Returns its turn, or `None`
    /// when an ask is already running.
    /// With `gate` (a namespace's connection), the call is decided by the gate first.
    /// `in_flight` is the connection's share of asks running at once: with none left, the ask
    /// ends at once with an error line, and only this connection's asks wait for a free one.
    pub fn start(
        self: &Arc<Self>,
        message: &[u8],
        backend: Arc<Backend>,
        receipts: Option<Arc<Receipts>>,
        gate: Option<Arc<ModelGate>>,
        in_flight: &Arc<Semaphore>,
    ) -> Option<u64> {
        let mut s = self.settings();
        if s.running.is_some() {
            return None;
        }
        let turn = self.reply.borrow().turn + 1;
        self.reply.send_replace(ReplyLines {
            turn,
            bytes: Vec::new(),
            done: false,
        });
        // The last reply's lines are gone.
        let _ = self.reply_held().set(0);
        let prepared = running_share(in_flight).and_then(|share| {
            let (request, body) = prepare(&s, message, &backend)?;
            let text = serde_json::to_vec(&body).expect("json");
            let size = text.len() as u64;
            if size > self.max_request_bytes {
                return Err(format!(
                    "the request would be {size} bytes, more than llmfs sends in one ({} bytes, --max-request-mb); the conversation so far is {} messages: start a new session",
                    self.max_request_bytes,
                    s.history.len()
                ));
            }
            // The request is held while the ask runs.
            let mut held = self.charge();
            held.set(size)
                .map_err(|e| format!("{e}: this ask's request is not sent"))?;
            // Hashed once: the gate decides on it and the receipt carries it.
            Ok((share, request, body, sha256(&text), held))
        });
        let session = self.clone();
        let timeout = s.timeout;
        let task = tokio::spawn(async move {
            // Held until the ask ends: the connection's share of asks running at once.
            let (_share, request, body, request_digest, request_held) = match prepared {
                Ok(p) => p,
                Err(e) => {
                    session.finish(turn, json!({"error": e}));
                    return;
                }
            };
            let deadline = tokio::time::Instant::now() + timeout;
            let admitted = match &gate {
                Some(g) => match g
                    .admit(&session.scope, &request.model, &request_digest, deadline)
                    .await
                {
                    Ok(a) => Some(a),
                    Err(e) => {
                        session.finish(turn, json!({"error": e}));
                        return;
                    }
                },
                None => None,
            };
            // The receipt's place is taken once the call is admitted, before the model is
            // asked: no place, no ask.
            let slot = match receipts.as_deref().map(Receipts::reserve).transpose() {
                Ok(slot) => slot,
                Err(e) => {
                    session.finish(turn, json!({"error": e}));
                    return;
                }
            };
            let mut on_event = |ev: Event| session.emit(turn, &ev);
            let asked = tokio::time::timeout_at(
                deadline,
                backend.ask(&body, &request.model, deadline, &mut on_event),
            )
            .await;
            // Sent: its body is given back before the conversation takes the new messages.
            drop((body, request_held));
            match asked {
                Ok(Ok(reply)) => {
                    session.answered(turn, &request, &reply);
                    if let Some(slot) = slot {
                        let got = serde_json::to_vec(&reply.as_message()).expect("json");
                        slot.send(receipt(
                            &session.scope,
                            backend.api().as_str(),
                            &request.model,
                            [request_digest, sha256(&got)],
                            reply.usage,
                            admitted.as_ref(),
                        ));
                    }
                }
                Ok(Err(e)) => session.failed(turn, &e),
                Err(_) => session.finish(
                    turn,
                    json!({"error": format!(
                        "no complete reply within {}s (the ask's timeout: `timeout SECS` in ctl)",
                        timeout.as_secs_f64()
                    )}),
                ),
            }
        });
        s.running = Some(task.abort_handle());
        Some(turn)
    }

    fn emit(&self, turn: u64, ev: &Event) {
        let mut line = serde_json::to_vec(ev).expect("json");
        line.push(b'\n');
        let mut over = None;
        self.reply.send_if_modified(|r| {
            if r.turn != turn || r.done {
                return false;
            }
            let size = r.bytes.len() + line.len();
            if size > MAX_REPLY_BYTES {
                over = Some(format!("the reply is over {MAX_REPLY_BYTES} bytes: cut"));
                return false;
            }
            if let Err(e) = self.reply_held().set(size as u64) {
                over = Some(format!("{e}: the reply is cut"));
                return false;
            }
            r.bytes.extend_from_slice(&line);
            true
        });
        if let Some(why) = over {
            // The reply is cut with an error, and the ask (this task) stopped.
            let running = self.settings().running.take();
            self.finish(turn, json!({ "error": why }));
            if let Some(h) = running {
                h.abort();
            }
        }
    }

    fn failed(&self, turn: u64, e: &AskError) {
        tracing::warn!(session = %short(&self.token), "ask failed: {e}");
        self.finish(turn, json!({"error": e.to_string()}));
    }

    fn answered(&self, turn: u64, request: &AskRequest, reply: &Reply) {
        {
            let mut s = self.settings();
            // The conversation goes on from the message and its answer; a failed ask leaves no
            // trace in it, so asking again does not repeat the message.
            // One ask is one or more new messages (a JSON array of them: the results of several
            // tool calls); the history did not change while it ran (one ask at a time).
            let mut new = request.messages[s.history.len().min(request.messages.len())..].to_vec();
            new.push(reply.as_message());
            let added: u64 = new
                .iter()
                .map(|m| serde_json::to_vec(m).expect("json").len() as u64)
                .sum();
            let to = s.held.bytes() + added;
            if let Err(e) = s.held.set(to) {
                drop(s);
                self.finish(
                    turn,
                    json!({"error": format!("{e}: the conversation does not keep this ask")}),
                );
                return;
            }
            s.history.extend(new);
            s.usage.prompt_tokens += reply.usage.prompt_tokens;
            s.usage.completion_tokens += reply.usage.completion_tokens;
        }
        tracing::info!(
            session = %short(&self.token),
            model = %request.model,
            prompt_tokens = reply.usage.prompt_tokens,
            completion_tokens = reply.usage.completion_tokens,
            "ask answered"
        );
        self.finish(
            turn,
            json!({"done": {
                "finish_reason": reply.finish_reason,
                "usage": reply.usage,
            }}),
        );
    }

    /// Appends the last line and ends the turn's stream.
    fn finish(&self, turn: u64, last: Value) {
        let mut line = serde_json::to_vec(&last).expect("json");
        line.push(b'\n');
        self.settings().running = None;
        self.reply.send_if_modified(|r| {
            if r.turn != turn || r.done {
                return false;
            }
            r.bytes.extend_from_slice(&line);
            r.done = true;
            true
        });
    }
}

/// Asks one connection may have running at once (its sessions together): each holds a place in
/// llmfs's receipt queue, shared by every namespace, from its decision to its answer.
pub const MAX_ASKS_IN_FLIGHT: usize = 16;

/// A share of the connection's asks running at once, or the error line's text.
fn running_share(in_flight: &Arc<Semaphore>) -> Result<OwnedSemaphorePermit, String> {
    in_flight.clone().try_acquire_owned().map_err(|_| {
        format!(
            "this connection has {MAX_ASKS_IN_FLIGHT} asks running, its most at once: ask again when one ended"
        )
    })
}

/// The request of an ask, from the session's settings and the new message; or the error line's
/// text.
fn prepare(s: &Settings, message: &[u8], backend: &Backend) -> Result<(AskRequest, Value), String> {
    let model = String::from_utf8_lossy(&s.model).trim().to_owned();
    if model.is_empty() {
        return Err("no model: write the model's name to `model`".into());
    }
    let tools: Vec<Value> = if s.tools.iter().all(u8::is_ascii_whitespace) {
        Vec::new()
    } else {
        serde_json::from_slice(&s.tools)
            .map_err(|e| format!("`tools` is not a JSON array of tool definitions: {e}"))?
    };
    let system = String::from_utf8_lossy(&s.system).into_owned();
    let mut messages = s.history.clone();
    messages.extend(parse_messages(message)?);
    let request = AskRequest {
        model,
        system: (!system.trim().is_empty()).then_some(system),
        tools,
        messages,
        max_tokens: s.max_tokens,
    };
    let body = backend.body(&request).map_err(|e| e.to_string())?;
    Ok((request, body))
}

/// What a namespace may write to `model`: a model's name as the gate takes it
/// ([`warren_gate::request::check_model_name`]), surrounding whitespace aside (`echo` adds a
/// newline), or nothing; at most [`MAX_MODEL_BYTES`] bytes in all.
pub fn check_model(bytes: &[u8]) -> Result<(), String> {
    if bytes.len() > MAX_MODEL_BYTES {
        return Err(format!("a model's name is at most {MAX_MODEL_BYTES} bytes"));
    }
    let name = std::str::from_utf8(bytes.trim_ascii())
        .map_err(|_| "a model's name is ASCII".to_owned())?;
    if name.is_empty() {
        return Ok(());
    }
    warren_gate::request::check_model_name(name)
}

/// Messages one ask may carry at most (a JSON array of them).
pub const MAX_MESSAGES_PER_ASK: usize = 256;

/// The new messages of an ask: a JSON array of message objects (each with a `role`: the results
/// of several tool calls, answered in one ask), else one message as [`parse_message`] reads it.
pub fn parse_messages(bytes: &[u8]) -> Result<Vec<Value>, String> {
    if let Ok(Value::Array(items)) = serde_json::from_slice::<Value>(bytes) {
        if items.is_empty() || items.len() > MAX_MESSAGES_PER_ASK {
            return Err(format!(
                "an ask carries 1 to {MAX_MESSAGES_PER_ASK} messages, not {}",
                items.len()
            ));
        }
        return items
            .into_iter()
            .map(|item| match item {
                Value::Object(m) if m.contains_key("role") => {
                    parse_message(&serde_json::to_vec(&m).expect("json"))
                }
                _ => Err("each message of an array is an object with a `role`".into()),
            })
            .collect();
    }
    parse_message(bytes).map(|m| vec![m])
}

/// A JSON message (an object with a `role`), else the text as a user message.
pub fn parse_message(bytes: &[u8]) -> Result<Value, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "the message is not UTF-8".to_owned())?;
    if let Ok(Value::Object(m)) = serde_json::from_str::<Value>(text.trim())
        && let Some(role) = m.get("role")
    {
        return match role.as_str() {
            Some("user" | "tool" | "assistant") => Ok(Value::Object(m)),
            _ => Err(format!(
                "message role {role}: expected \"user\", \"tool\" or \"assistant\""
            )),
        };
    }
    if text.trim().is_empty() {
        return Err("an empty message".into());
    }
    Ok(json!({"role": "user", "content": text.trim_end_matches('\n')}))
}

pub(crate) fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// The model call's receipt: which model, the counts, and digests of what was sent and what came
/// back — never the text itself. A namespace's call names the gate's decision that admitted it
/// and is charged to its subtree's budgets.
fn receipt(
    scope: &str,
    api: &str,
    model: &str,
    [request_digest, reply_digest]: [String; 2],
    usage: Usage,
    admitted: Option<&Admitted>,
) -> Value {
    let mut receipt = json!({
        "scope": scope,
        "kind": "query",
        "subject": {
            "server": "llmfs",
            "api": api,
            "model": model,
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
        },
        "digests": {"request": request_digest, "reply": reply_digest},
    });
    if let Some(a) = admitted {
        if let Some(ack) = &a.decision {
            receipt["subject"]["decision"] = json!({"seq": ack.seq, "hash": ack.hash});
        }
        if let Some(b) = &a.budgets {
            receipt["budgets"] = b.clone();
        }
    }
    receipt
}

/// A session's receipt scope: named by a digest of its token, so the log never holds the token.
pub fn scope_of(token: &str) -> String {
    format!(
        "llm-{}",
        &hex::encode(Sha256::digest(token.as_bytes()))[..16]
    )
}

/// The start of a token, for logs.
fn short(token: &str) -> &str {
    &token[..token.len().min(8)]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session() -> Session {
        Session::new(
            "t".into(),
            &Defaults {
                model: String::new(),
                timeout: Duration::from_secs(300),
                max_tokens: None,
                max_request_bytes: crate::memory::DEFAULT_MAX_REQUEST_BYTES,
            },
            crate::memory::Ledger::new(crate::memory::DEFAULT_SUBTREE_BYTES).connection(),
        )
    }

    #[test]
    fn control_lines_are_applied_whole_or_refused_whole() {
        let s = session();
        s.control("max_tokens 64\ntimeout 2.5\n").unwrap();
        assert_eq!(s.control_text(), "max_tokens 64\ntimeout 2.5\n");
        for bad in [
            "timeout 0",
            "timeout -1",
            "timeout nan",
            "timeout 100000",
            "max_tokens x",
            "max_tokens 5 6",
            "temperature 1",
            "max_tokens 8\ntimeout 0",
        ] {
            assert!(s.control(bad).is_err(), "{bad:?}");
        }
        assert_eq!(s.control_text(), "max_tokens 64\ntimeout 2.5\n");
        s.control("max_tokens 0").unwrap();
        assert!(s.control_text().starts_with("max_tokens 0\n"));
    }

    #[test]
    fn a_message_is_json_with_a_role_or_else_user_text() {
        assert_eq!(
            parse_message(b"hello\n").unwrap(),
            json!({"role": "user", "content": "hello"})
        );
        let tool = json!({"role": "tool", "tool_call_id": "c1", "content": "42"});
        assert_eq!(parse_message(tool.to_string().as_bytes()).unwrap(), tool);
        // JSON without a role is text to the model.
        assert_eq!(
            parse_message(br#"{"a": 1}"#).unwrap(),
            json!({"role": "user", "content": "{\"a\": 1}"})
        );
        assert!(parse_message(br#"{"role": "system", "content": "x"}"#).is_err());
        assert!(parse_message(b" \n").is_err());
        assert!(parse_message(b"\xff").is_err());
        let two = json!([{"role": "tool", "tool_call_id": "a", "content": "1"},
                         {"role": "tool", "tool_call_id": "b", "content": "2"}]);
        assert_eq!(parse_messages(two.to_string().as_bytes()).unwrap().len(), 2);
        assert!(parse_messages(b"[]").is_err());
        assert!(parse_messages(br#"[{"role": "system", "content": "x"}]"#).is_err());
        assert!(parse_messages(br#"[1]"#).is_err());
        assert_eq!(parse_messages(b"plain").unwrap().len(), 1);
    }

    #[test]
    fn a_setting_written_in_pieces_is_put_together_and_capped() {
        let s = session();
        s.write_setting(Setting::System, 0, b"Be ").unwrap();
        s.write_setting(Setting::System, 3, b"brief.").unwrap();
        assert_eq!(s.read_setting(Setting::System), b"Be brief.");
        s.write_setting(Setting::System, 0, b"New").unwrap();
        assert_eq!(s.read_setting(Setting::System), b"New");
        assert!(s.write_setting(Setting::System, 10, b"x").is_err());
        assert!(
            s.write_setting(Setting::Tools, 0, &vec![b' '; MAX_FILE_BYTES + 1])
                .is_err()
        );
    }

    #[test]
    fn a_model_name_is_checked_whole_when_written_in_pieces() {
        let s = session();
        s.write_setting(Setting::Model, 0, b"org/model").unwrap();
        s.write_setting(Setting::Model, 9, b":q4@2024\n").unwrap();
        assert_eq!(s.read_setting(Setting::Model), b"org/model:q4@2024\n");
        for bad in [&b"gpt 4"[..], b"gpt-4\n\nx", b"m\xff", b"a;b"] {
            assert!(
                matches!(
                    s.write_setting(Setting::Model, 0, bad),
                    Err(SettingError::Invalid(_))
                ),
                "{bad:?}"
            );
        }
        assert!(matches!(
            s.write_setting(Setting::Model, 0, &[b'm'; MAX_MODEL_BYTES + 1]),
            Err(SettingError::TooBig(_))
        ));
        assert_eq!(s.read_setting(Setting::Model), b"org/model:q4@2024\n");
        // Emptied, the session has no model (the ask says so); that is not a bad name.
        s.write_setting(Setting::Model, 0, b"").unwrap();
    }

    /// Every `query` receipt fits receiptd's request limit, so no ask is refused (or checked,
    /// per ask) for its receipt's size: the largest one — the longest model name, the deepest
    /// lineage with every budget set, the largest counts and decision — is far below it.
    #[test]
    fn the_largest_query_receipt_fits_receiptd() {
        use warren_proto::lineage::{Budget, Lineage, MAX_DEPTH, Member};
        let lineage = Lineage(
            (0..MAX_DEPTH)
                .map(|i| Member {
                    session: format!("{i:032x}"),
                    namespace: i.to_string(),
                    budget: Budget {
                        receipts: Some(u64::MAX),
                        receipt_bytes: Some(u64::MAX),
                        asks: Some(u64::MAX),
                        llm_bytes: Some(u64::MAX),
                    },
                    ..Member::default()
                })
                .collect(),
        );
        lineage.check(&format!("{:032x}", 0), "0").unwrap();
        let digest = sha256(b"");
        let largest = receipt(
            &"f".repeat(32),
            "anthropic",
            &"m".repeat(MAX_MODEL_BYTES),
            [digest.clone(), digest.clone()],
            Usage {
                prompt_tokens: u64::MAX,
                completion_tokens: u64::MAX,
            },
            Some(&Admitted {
                decision: Some(warren_proto::receipts::Ack {
                    seq: u64::MAX,
                    hash: digest,
                }),
                budgets: Some(serde_json::to_value(lineage.budget_keys()).unwrap()),
            }),
        );
        let size = serde_json::to_vec(&largest).unwrap().len();
        assert!(
            size * 4 < warren_receiptd::receipt::MAX_REQUEST_BYTES,
            "{size} bytes"
        );
    }

    #[test]
    fn a_scope_names_the_session_without_its_token() {
        let scope = scope_of("0123456789abcdef0123456789abcdef");
        assert!(scope.starts_with("llm-") && scope.len() == 20, "{scope}");
        assert!(!scope.contains("0123456789abcdef"));
    }
}
