//! One client session with one MCP server, over any byte stream (a stdio server's pipes, which
//! mcpfs gets from the namespace nsd runs the server in), through the official Rust SDK.
//!
//! The session declares no client capabilities: a server's requests for sampling, elicitation
//! or roots are refused with an error, and a result that asks for input (`input_required`) or
//! hands back a task is a clear error to the caller, not a hang. Every call has a deadline.
//!
//! Why one file: one MCP client session over the SDK is ≈ 590 lines; the rest are its tests against
//! a server in the same process's pipes.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::CallToolRequestParams;
use rmcp::service::{RoleClient, RunningService, ServiceExt};
use serde_json::{Map, Value};

use crate::definition::{Definition, Unservable};
use crate::result::Outcome;

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("the MCP server did not complete the handshake: {0}")]
    Handshake(String),
    #[error("the MCP server answered with an error: {0}")]
    Protocol(String),
    #[error("the MCP server did not answer within {0:?}")]
    Timeout(Duration),
    #[error(
        "the MCP server asked for input ({0}); warren routes no sampling, elicitation or roots requests to a caller"
    )]
    InputRequired(&'static str),
    #[error("the MCP server's reply is not a tool result: {0}")]
    Malformed(String),
}

/// What the session does with the server's notifications: a `notifications/tools/list_changed`
/// is remembered, so the next call lists the tools again before it runs (a definition that
/// changed is then held: `crate::served`); progress and log messages are kept for the call they
/// belong to ([`Notes`]).
#[derive(Clone, Default)]
pub struct Notified {
    tools_changed: Arc<AtomicBool>,
    notes: Arc<Mutex<Notes>>,
}

/// The most notes (progress and log messages) one call keeps; later ones are dropped.
pub const MAX_NOTES: usize = 64;
/// The most bytes of one log message's data (as JSON) kept; a longer one is cut, as text.
pub const MAX_NOTE_BYTES: usize = 4096;

/// What the server said during the calls under way. Progress belongs to the request whose
/// progress token it names (rmcp gives every request one; it is kept by token until the call
/// takes it, since it may come before the call learns its token). A log message names no call:
/// it is kept only when exactly one call is under way on the session, so that no call (of one
/// namespace) is ever handed what the server said during another's (docs/decisions.md).
#[derive(Default)]
struct Notes {
    /// Numbers the calls and, across all of them, the notes (so a call's notes keep their order).
    next: u64,
    /// How many progress and log notifications the handlers have taken (kept or not).
    handled: u64,
    /// The log messages of each call under way, by call number.
    calls: std::collections::HashMap<u64, Vec<(u64, Value)>>,
    /// Progress by token (its JSON form), for at most [`MAX_TOKENS`] tokens at once.
    progress: std::collections::HashMap<String, Vec<(u64, Value)>>,
}

/// The most progress tokens whose notes are kept at once (a server naming tokens no call has
/// cannot grow mcpfs: past this, notes for a new token are dropped).
const MAX_TOKENS: usize = 256;

impl Notes {
    fn number(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    fn keep(notes: &mut Vec<(u64, Value)>, seq: u64, note: Value) {
        if notes.len() < MAX_NOTES {
            notes.push((seq, note));
        }
    }

    /// Progress for the request whose token is `key`.
    fn progress(&mut self, key: String, note: Value) {
        self.handled += 1;
        let seq = self.number();
        if self.progress.len() < MAX_TOKENS || self.progress.contains_key(&key) {
            Notes::keep(self.progress.entry(key).or_default(), seq, note);
        }
    }

    /// A log message: the one call under way's, or dropped.
    fn log(&mut self, note: Value) {
        self.handled += 1;
        let seq = self.number();
        if self.calls.len() == 1
            && let Some(kept) = self.calls.values_mut().next()
        {
            Notes::keep(kept, seq, note);
        }
    }
}

fn token_key(token: &rmcp::model::ProgressToken) -> String {
    serde_json::to_string(token).unwrap_or_default()
}

impl rmcp::ClientHandler for Notified {
    fn on_tool_list_changed(
        &self,
        _context: rmcp::service::NotificationContext<RoleClient>,
    ) -> impl std::future::Future<Output = ()> + Send + '_ {
        self.tools_changed.store(true, Ordering::Release);
        std::future::ready(())
    }

    fn on_progress(
        &self,
        params: rmcp::model::ProgressNotificationParam,
        _context: rmcp::service::NotificationContext<RoleClient>,
    ) -> impl std::future::Future<Output = ()> + Send + '_ {
        if params.progress.is_finite() {
            let mut note = serde_json::json!({"progress": params.progress});
            if let Some(total) = params.total.filter(|t| t.is_finite()) {
                note["total"] = total.into();
            }
            if let Some(message) = params.message {
                note["message"] = cut(message).into();
            }
            self.notes
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .progress(
                    token_key(&params.progress_token),
                    serde_json::json!({"progress": note}),
                );
        }
        std::future::ready(())
    }

    #[allow(deprecated)] // MCP's logging: deprecated by SEP-2577, still what servers send.
    fn on_logging_message(
        &self,
        params: rmcp::model::LoggingMessageNotificationParam,
        _context: rmcp::service::NotificationContext<RoleClient>,
    ) -> impl std::future::Future<Output = ()> + Send + '_ {
        let data = serde_json::to_string(&params.data).unwrap_or_default();
        let data = if data.len() > MAX_NOTE_BYTES {
            Value::String(cut(data))
        } else {
            params.data
        };
        let mut log = serde_json::json!({"level": params.level, "data": data});
        if let Some(logger) = params.logger {
            log["logger"] = cut(logger).into();
        }
        self.notes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .log(serde_json::json!({"log": log}));
        std::future::ready(())
    }
}

/// `s` cut to at most [`MAX_NOTE_BYTES`] bytes (at a character boundary).
fn cut(mut s: String) -> String {
    if s.len() > MAX_NOTE_BYTES {
        let mut end = MAX_NOTE_BYTES;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// A call's place in [`Notes`]: taken before the call is sent, given up (its notes taken, with
/// its progress) when it ends or is dropped.
struct NoteSlot {
    notes: Arc<Mutex<Notes>>,
    call: u64,
    token: Option<String>,
}

impl NoteSlot {
    fn take(notes: &Arc<Mutex<Notes>>) -> NoteSlot {
        let mut n = notes.lock().unwrap_or_else(|p| p.into_inner());
        let call = n.number();
        n.calls.insert(call, Vec::new());
        NoteSlot {
            notes: notes.clone(),
            call,
            token: None,
        }
    }

    /// The call's notes in the order they came: its log messages and its token's progress.
    fn notes(&mut self) -> Vec<Value> {
        let mut n = self.notes.lock().unwrap_or_else(|p| p.into_inner());
        let mut all = n.calls.remove(&self.call).unwrap_or_default();
        if let Some(token) = self.token.take() {
            all.extend(n.progress.remove(&token).unwrap_or_default());
        }
        all.sort_by_key(|(seq, _)| *seq);
        all.truncate(MAX_NOTES);
        all.into_iter().map(|(_, note)| note).collect()
    }
}

impl Drop for NoteSlot {
    fn drop(&mut self) {
        let mut n = self.notes.lock().unwrap_or_else(|p| p.into_inner());
        n.calls.remove(&self.call);
        if let Some(token) = &self.token {
            n.progress.remove(token);
        }
    }
}

/// The most tools one server may list.
pub const MAX_TOOLS: usize = 1024;
/// The most resources one server may list.
pub const MAX_RESOURCES: usize = 1024;
/// The most pages a listing (of tools, of resources) may take.
pub const MAX_LIST_PAGES: usize = 64;
/// The most bytes a whole listing (of tools, of resources) may take.
pub const MAX_LISTING_BYTES: usize = 8 << 20;
/// The most bytes of one call's result (as the server sent it, JSON): a larger one is an
/// error for the caller, not a result.
pub const MAX_RESULT_BYTES: usize = 4 << 20;

/// A live session. Dropping it closes the stream.
pub struct Session {
    client: RunningService<RoleClient, Notified>,
    tools_changed: Arc<AtomicBool>,
    notes: Arc<Mutex<Notes>>,
    /// How many progress and log notifications have been read off a stdio server's pipe
    /// ([`CountingNotes`]); none for an HTTP server.
    seen: Option<Arc<AtomicU64>>,
}

/// The longest a call's end waits for the handlers of the notes read before its response.
const NOTES_SETTLE: Duration = Duration::from_millis(250);

/// Counts, as its bytes are read, each line of a stdio server's output that is a progress or
/// log notification. rmcp handles each notification in a task of its own but hands a response
/// straight to its caller, so a call's response can overtake the handling of the notes the
/// server sent before it; with this count a call waits (bounded) for the handlers to catch up
/// with what was read before its response. A quoted `"notifications/…"` inside a JSON string
/// is escaped (`\"`), so it never counts.
struct CountingNotes<R> {
    inner: R,
    seen: Arc<AtomicU64>,
    /// The current line's last bytes (a name split between two reads), and whether the line
    /// has named one of [`NOTE_METHODS`] so far.
    tail: Vec<u8>,
    matched: bool,
}

const NOTE_METHODS: [&[u8]; 2] = [b"\"notifications/progress\"", b"\"notifications/message\""];

impl<R> CountingNotes<R> {
    fn new(inner: R) -> Self {
        CountingNotes {
            inner,
            seen: Arc::default(),
            tail: Vec::new(),
            matched: false,
        }
    }

    fn scan(&mut self, mut bytes: &[u8]) {
        let longest = NOTE_METHODS.iter().map(|m| m.len()).max().unwrap_or(0);
        loop {
            let (line, rest) = match bytes.iter().position(|b| *b == b'\n') {
                Some(nl) => (&bytes[..nl], Some(&bytes[nl + 1..])),
                None => (bytes, None),
            };
            if !self.matched {
                self.tail.extend_from_slice(line);
                self.matched = NOTE_METHODS
                    .iter()
                    .any(|m| self.tail.windows(m.len()).any(|w| w == *m));
                let keep = self.tail.len().saturating_sub(longest - 1);
                self.tail.drain(..keep);
            }
            let Some(rest) = rest else { return };
            if self.matched {
                self.seen.fetch_add(1, Ordering::AcqRel);
            }
            self.tail.clear();
            self.matched = false;
            bytes = rest;
        }
    }
}

impl<R: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for CountingNotes<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        if polled.is_ready() {
            self.scan(&buf.filled()[before..]);
        }
        polled
    }
}

impl Session {
    /// Speaks MCP (the handshake first) on `reader`/`writer`, within `deadline`.
    pub async fn over<R, W>(
        reader: R,
        writer: W,
        deadline: Duration,
    ) -> Result<Session, SessionError>
    where
        R: tokio::io::AsyncRead + Send + Unpin + 'static,
        W: tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        let notified = Notified::default();
        let (tools_changed, notes) = (notified.tools_changed.clone(), notified.notes.clone());
        let reader = CountingNotes::new(reader);
        let seen = Some(reader.seen.clone());
        let client = tokio::time::timeout(deadline, notified.serve((reader, writer)))
            .await
            .map_err(|_| SessionError::Timeout(deadline))?
            .map_err(|e| SessionError::Handshake(e.to_string()))?;
        Ok(Session {
            client,
            tools_changed,
            notes,
            seen,
        })
    }

    /// Speaks MCP to a streamable-HTTP server at `url` (the handshake first), within
    /// `deadline`. Plain `http://` only: this build carries no TLS provider for the MCP client
    /// (`docs/gaps.md`).
    pub async fn http(url: &str, deadline: Duration) -> Result<Session, SessionError> {
        let transport = rmcp::transport::StreamableHttpClientTransport::from_uri(url.to_string());
        let notified = Notified::default();
        let (tools_changed, notes) = (notified.tools_changed.clone(), notified.notes.clone());
        let client = tokio::time::timeout(deadline, notified.serve(transport))
            .await
            .map_err(|_| SessionError::Timeout(deadline))?
            .map_err(|e| SessionError::Handshake(e.to_string()))?;
        Ok(Session {
            client,
            tools_changed,
            notes,
            seen: None,
        })
    }

    /// The server's name and version as it gave them, for logs and `warren mcp check`.
    pub fn server_info(&self) -> Option<String> {
        self.client
            .peer_info()
            .and_then(|i| i.server_info.clone())
            .map(|s| format!("{} {}", s.name, s.version))
    }

    /// Whether the session has ended (the server hung up, or its stream broke).
    pub fn is_closed(&self) -> bool {
        self.client.is_closed() || self.client.peer().is_transport_closed()
    }

    /// Whether the server said its tool list changed since this was last asked (and clears it).
    pub fn take_tools_changed(&self) -> bool {
        self.tools_changed.swap(false, Ordering::AcqRel)
    }

    /// Every tool the server lists (all pages), each made a [`Definition`] or refused (a name
    /// listed twice is refused each time: [`Definition::from_listings`]). Bounded as every
    /// listing is ([`Session::listing`]): at most [`MAX_TOOLS`] tools.
    pub async fn tools(
        &self,
        deadline: Duration,
    ) -> Result<Vec<Result<Definition, Unservable>>, SessionError> {
        let listed = self
            .listing("tool", "tools", MAX_TOOLS, deadline, |params| {
                self.client.list_tools(params)
            })
            .await?;
        Ok(Definition::from_listings(&listed))
    }

    /// The server's resources (all pages) as `(uri, mimeType)`; none when it serves none (or
    /// does not speak of resources at all). Bounded as every listing is
    /// ([`Session::listing`]): at most [`MAX_RESOURCES`] resources.
    pub async fn resources(
        &self,
        deadline: Duration,
    ) -> Result<Vec<(String, Option<String>)>, SessionError> {
        let has = self
            .client
            .peer_info()
            .is_some_and(|i| i.capabilities.resources.is_some());
        if !has {
            return Ok(Vec::new());
        }
        let listed = self
            .listing("resource", "resources", MAX_RESOURCES, deadline, |params| {
                self.client.list_resources(params)
            })
            .await?;
        Ok(listed
            .iter()
            .filter_map(|r| {
                let uri = r.get("uri")?.as_str()?.to_string();
                let mime = r
                    .get("mimeType")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                Some((uri, mime))
            })
            .collect())
    }

    /// The items (member `key` of each page) of a listing the server pages through with
    /// `nextCursor`, asked for by `page`. Bounded, so a hostile server cannot grow mcpfs (which
    /// serves every server) without end: at most `max_items` items over [`MAX_LIST_PAGES`]
    /// pages and [`MAX_LISTING_BYTES`] in all, all within `deadline`; past a bound the listing
    /// is an error naming it (`what`: the items' name).
    async fn listing<'a, P, F>(
        &'a self,
        what: &str,
        key: &str,
        max_items: usize,
        deadline: Duration,
        page: impl Fn(Option<rmcp::model::PaginatedRequestParams>) -> F,
    ) -> Result<Vec<Value>, SessionError>
    where
        F: std::future::Future<Output = Result<P, rmcp::ServiceError>> + 'a,
        P: serde::Serialize,
    {
        let until = tokio::time::Instant::now() + deadline;
        let mut cursor: Option<String> = None;
        let (mut items, mut bytes) = (Vec::new(), 0usize);
        for _ in 0..MAX_LIST_PAGES {
            let params = cursor
                .take()
                .map(|c| rmcp::model::PaginatedRequestParams::default().with_cursor(Some(c)));
            let listed = tokio::time::timeout_at(until, page(params))
                .await
                .map_err(|_| SessionError::Timeout(deadline))?
                .map_err(|e| SessionError::Protocol(e.to_string()))?;
            let mut v = serde_json::to_value(&listed)
                .map_err(|e| SessionError::Malformed(e.to_string()))?;
            bytes += serde_json::to_vec(&v).map_or(0, |b| b.len());
            if bytes > MAX_LISTING_BYTES {
                return Err(SessionError::Malformed(format!(
                    "the {what} listing is over {MAX_LISTING_BYTES} bytes"
                )));
            }
            if let Some(Value::Array(page_items)) = v.get_mut(key).map(Value::take) {
                items.extend(page_items);
            }
            if items.len() > max_items {
                return Err(SessionError::Malformed(format!(
                    "the server lists more than {max_items} {what}s"
                )));
            }
            match v.get("nextCursor").and_then(Value::as_str) {
                Some(next) if !next.is_empty() => cursor = Some(next.to_string()),
                _ => return Ok(items),
            }
        }
        Err(SessionError::Malformed(format!(
            "the {what} listing goes on past {MAX_LIST_PAGES} pages"
        )))
    }

    /// Resource `uri` as the server gave it (`contents`: each with its URI, MIME type, and text
    /// or base64 blob), within `deadline`, at most [`MAX_RESULT_BYTES`] of JSON.
    pub async fn read_resource_mcp(
        &self,
        uri: &str,
        deadline: Duration,
    ) -> Result<Value, SessionError> {
        let params = rmcp::model::ReadResourceRequestParams::new(uri.to_string());
        let read = tokio::time::timeout(deadline, self.client.read_resource(params))
            .await
            .map_err(|_| SessionError::Timeout(deadline))?
            .map_err(|e| SessionError::Protocol(e.to_string()))?;
        let v = serde_json::to_value(&read).map_err(|e| SessionError::Malformed(e.to_string()))?;
        let size = serde_json::to_vec(&v).map_or(usize::MAX, |b| b.len());
        if size > MAX_RESULT_BYTES {
            return Err(SessionError::Malformed(format!(
                "the resource is {size} bytes; the most taken is {MAX_RESULT_BYTES}"
            )));
        }
        Ok(serde_json::json!({"contents": v["contents"]}))
    }

    /// The bytes of resource `uri`: its text contents as UTF-8, its blobs decoded, one after
    /// another.
    pub async fn read_resource(
        &self,
        uri: &str,
        deadline: Duration,
    ) -> Result<Vec<u8>, SessionError> {
        use base64::Engine;
        let params = rmcp::model::ReadResourceRequestParams::new(uri.to_string());
        let read = tokio::time::timeout(deadline, self.client.read_resource(params))
            .await
            .map_err(|_| SessionError::Timeout(deadline))?
            .map_err(|e| SessionError::Protocol(e.to_string()))?;
        let v = serde_json::to_value(&read).map_err(|e| SessionError::Malformed(e.to_string()))?;
        let mut bytes = Vec::new();
        for c in v["contents"].as_array().into_iter().flatten() {
            if let Some(t) = c.get("text").and_then(Value::as_str) {
                bytes.extend_from_slice(t.as_bytes());
            } else if let Some(b) = c.get("blob").and_then(Value::as_str) {
                let decoded = base64::engine::general_purpose::STANDARD
                    .decode(b)
                    .map_err(|e| SessionError::Malformed(format!("a blob is not base64: {e}")))?;
                bytes.extend_from_slice(&decoded);
            }
        }
        Ok(bytes)
    }

    /// Calls `tool` with `arguments` (already validated and canonical), within `deadline`. A
    /// call that times out is cancelled at the server (`notifications/cancelled`). The call
    /// carries a progress token of its own; the server's progress for it and its log messages
    /// while it was the one call under way come back in the outcome's `notes`.
    pub async fn call(
        &self,
        tool: &str,
        arguments: Map<String, Value>,
        deadline: Duration,
    ) -> Result<Outcome, SessionError> {
        let mut slot = NoteSlot::take(&self.notes);
        let params = CallToolRequestParams::new(tool.to_string()).with_arguments(arguments);
        let request =
            rmcp::model::ClientRequest::CallToolRequest(rmcp::model::CallToolRequest::new(params));
        // With a timeout, rmcp cancels the request at the server when it passes.
        let handle = tokio::time::timeout(
            deadline,
            self.client.peer().send_request_with_option(
                request,
                rmcp::service::PeerRequestOptions::with_timeout(deadline),
            ),
        )
        .await
        .map_err(|_| SessionError::Timeout(deadline))?
        .map_err(|e| SessionError::Protocol(e.to_string()))?;
        slot.token = Some(token_key(&handle.progress_token));
        let result = match handle.await_response().await {
            Ok(rmcp::model::ServerResult::CallToolResult(result)) => result,
            Ok(rmcp::model::ServerResult::EmptyResult(_)) => {
                rmcp::model::CallToolResult::success(Vec::new())
            }
            Ok(rmcp::model::ServerResult::InputRequiredResult(_)) => {
                return Err(SessionError::InputRequired("input_required"));
            }
            Ok(rmcp::model::ServerResult::CreateTaskResult(_)) => {
                return Err(SessionError::InputRequired("a task to poll"));
            }
            Ok(_) => {
                return Err(SessionError::Malformed(
                    "a kind of tool result this client does not know".into(),
                ));
            }
            Err(rmcp::ServiceError::Timeout { .. }) => return Err(SessionError::Timeout(deadline)),
            Err(e) => return Err(SessionError::Protocol(e.to_string())),
        };
        let v =
            serde_json::to_value(&result).map_err(|e| SessionError::Malformed(e.to_string()))?;
        let size = serde_json::to_vec(&v).map_or(usize::MAX, |b| b.len());
        if size > MAX_RESULT_BYTES {
            return Err(SessionError::Malformed(format!(
                "the result is {size} bytes; the most taken is {MAX_RESULT_BYTES}"
            )));
        }
        self.settle_notes().await;
        let mut outcome = Outcome::from_result(&v);
        outcome.notes = slot.notes();
        Ok(outcome)
    }

    /// Waits, at most [`NOTES_SETTLE`], until every note read so far has been handled.
    async fn settle_notes(&self) {
        let Some(seen) = &self.seen else {
            tokio::task::yield_now().await;
            return;
        };
        let target = seen.load(Ordering::Acquire);
        let until = tokio::time::Instant::now() + NOTES_SETTLE;
        while self.notes.lock().unwrap_or_else(|p| p.into_inner()).handled < target
            && tokio::time::Instant::now() < until
        {
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Ends the session (the server sees its stdin close).
    pub async fn close(self) {
        let _ = self.client.cancel().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn slot(notes: &Arc<Mutex<Notes>>, token: &str) -> NoteSlot {
        let mut slot = NoteSlot::take(notes);
        slot.token = Some(token.to_owned());
        slot
    }

    /// A log message names no call: with one call under way it is that call's, in order with
    /// its progress; with two, it is neither's, so no namespace is handed what the server said
    /// during another's call. Progress goes only to the call whose token it names.
    #[test]
    fn a_log_message_is_a_calls_only_while_it_is_the_one_under_way() {
        let notes = Arc::new(Mutex::new(Notes::default()));
        let mut alone = slot(&notes, "1");
        notes
            .lock()
            .unwrap()
            .progress("1".into(), json!({"progress": 0}));
        notes.lock().unwrap().log(json!({"log": "alone"}));
        notes
            .lock()
            .unwrap()
            .progress("1".into(), json!({"progress": 50}));
        assert_eq!(
            alone.notes(),
            [
                json!({"progress": 0}),
                json!({"log": "alone"}),
                json!({"progress": 50})
            ]
        );
        drop(alone);

        let mut a = slot(&notes, "2");
        let mut b = slot(&notes, "3");
        notes.lock().unwrap().log(json!({"log": "whose?"}));
        notes
            .lock()
            .unwrap()
            .progress("3".into(), json!({"progress": 1}));
        assert_eq!(a.notes(), Vec::<Value>::new());
        assert_eq!(b.notes(), [json!({"progress": 1})]);
    }

    /// A progress or log notification is counted once its line ends, whatever the reads' cuts;
    /// a result quoting the method inside a string is not.
    #[test]
    fn notes_are_counted_as_their_lines_are_read() {
        let mut c = CountingNotes::new(());
        let stream = concat!(
            r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":0,"progress":1}}"#,
            "\n",
            r#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"x"}}"#,
            "\n",
            r#"{"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"text","text":"\"notifications/message\""}]}}"#,
            "\n",
        )
        .as_bytes();
        for chunk in stream.chunks(7) {
            c.scan(chunk);
        }
        assert_eq!(c.seen.load(Ordering::Acquire), 2);
    }

    #[test]
    fn notes_are_bounded_and_given_up_with_the_call() {
        let notes = Arc::new(Mutex::new(Notes::default()));
        let mut one = slot(&notes, "1");
        for i in 0..(MAX_NOTES + 10) {
            notes.lock().unwrap().log(json!({"log": i}));
        }
        assert_eq!(one.notes().len(), MAX_NOTES);
        for t in 0..(MAX_TOKENS + 10) {
            notes
                .lock()
                .unwrap()
                .progress(t.to_string(), json!({"progress": 1}));
        }
        assert_eq!(notes.lock().unwrap().progress.len(), MAX_TOKENS);
        drop(one);
        let dropped = slot(&notes, "7");
        drop(dropped);
        let n = notes.lock().unwrap();
        assert!(n.calls.is_empty() && !n.progress.contains_key("7"));
        assert_eq!(cut("é".repeat(MAX_NOTE_BYTES)).len(), MAX_NOTE_BYTES);
    }
}
