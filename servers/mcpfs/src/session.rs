//! One client session with one MCP server, over any byte stream (a stdio server's pipes, which
//! mcpfs gets from the namespace nsd runs the server in), through the official Rust SDK.
//!
//! The session declares no client capabilities: a server's requests for sampling, elicitation
//! or roots are refused with an error, and a result that asks for input (`input_required`) or
//! hands back a task is a clear error to the caller, not a hang. Every call has a deadline.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResponse};
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
/// changed is then held: `crate::served`).
#[derive(Clone, Default)]
pub struct Notified {
    tools_changed: Arc<AtomicBool>,
}

impl rmcp::ClientHandler for Notified {
    fn on_tool_list_changed(
        &self,
        _context: rmcp::service::NotificationContext<RoleClient>,
    ) -> impl std::future::Future<Output = ()> + Send + '_ {
        self.tools_changed.store(true, Ordering::Release);
        std::future::ready(())
    }
}

/// The most tools one server may list.
pub const MAX_TOOLS: usize = 1024;
/// The most pages a listing may take.
pub const MAX_LIST_PAGES: usize = 64;
/// The most bytes a whole listing may take.
pub const MAX_LISTING_BYTES: usize = 8 << 20;
/// The most bytes of one call's result (as the server sent it, JSON): a larger one is an
/// error for the caller, not a result.
pub const MAX_RESULT_BYTES: usize = 4 << 20;

/// A live session. Dropping it closes the stream.
pub struct Session {
    client: RunningService<RoleClient, Notified>,
    tools_changed: Arc<AtomicBool>,
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
        let tools_changed = notified.tools_changed.clone();
        let client = tokio::time::timeout(deadline, notified.serve((reader, writer)))
            .await
            .map_err(|_| SessionError::Timeout(deadline))?
            .map_err(|e| SessionError::Handshake(e.to_string()))?;
        Ok(Session {
            client,
            tools_changed,
        })
    }

    /// Speaks MCP to a streamable-HTTP server at `url` (the handshake first), within
    /// `deadline`. Plain `http://` only: this build carries no TLS provider for the MCP client
    /// (`docs/gaps.md`).
    pub async fn http(url: &str, deadline: Duration) -> Result<Session, SessionError> {
        let transport = rmcp::transport::StreamableHttpClientTransport::from_uri(url.to_string());
        let notified = Notified::default();
        let tools_changed = notified.tools_changed.clone();
        let client = tokio::time::timeout(deadline, notified.serve(transport))
            .await
            .map_err(|_| SessionError::Timeout(deadline))?
            .map_err(|e| SessionError::Handshake(e.to_string()))?;
        Ok(Session {
            client,
            tools_changed,
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

    /// Every tool the server lists (all pages), each made a [`Definition`] or refused. Bounded,
    /// so a hostile server cannot grow mcpfs (which serves every server) without end: at most
    /// [`MAX_TOOLS`] tools over [`MAX_LIST_PAGES`] pages and [`MAX_LISTING_BYTES`] in all, all
    /// within `deadline`.
    pub async fn tools(
        &self,
        deadline: Duration,
    ) -> Result<Vec<Result<Definition, Unservable>>, SessionError> {
        let until = tokio::time::Instant::now() + deadline;
        let mut cursor: Option<String> = None;
        let (mut tools, mut bytes) = (Vec::new(), 0usize);
        for _ in 0..MAX_LIST_PAGES {
            let params = cursor
                .take()
                .map(|c| rmcp::model::PaginatedRequestParams::default().with_cursor(Some(c)));
            let page = tokio::time::timeout_at(until, self.client.list_tools(params))
                .await
                .map_err(|_| SessionError::Timeout(deadline))?
                .map_err(|e| SessionError::Protocol(e.to_string()))?;
            let v =
                serde_json::to_value(&page).map_err(|e| SessionError::Malformed(e.to_string()))?;
            bytes += serde_json::to_vec(&v).map_or(0, |b| b.len());
            if bytes > MAX_LISTING_BYTES {
                return Err(SessionError::Malformed(format!(
                    "the tool listing is over {MAX_LISTING_BYTES} bytes"
                )));
            }
            for t in v["tools"].as_array().into_iter().flatten() {
                tools.push(Definition::from_listing(t));
            }
            if tools.len() > MAX_TOOLS {
                return Err(SessionError::Malformed(format!(
                    "the server lists more than {MAX_TOOLS} tools"
                )));
            }
            match v.get("nextCursor").and_then(Value::as_str) {
                Some(next) if !next.is_empty() => cursor = Some(next.to_string()),
                _ => return Ok(tools),
            }
        }
        Err(SessionError::Malformed(format!(
            "the tool listing goes on past {MAX_LIST_PAGES} pages"
        )))
    }

    /// The server's resources (all pages) as `(uri, mimeType)`; none when it serves none (or
    /// does not speak of resources at all).
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
        let listed = tokio::time::timeout(deadline, self.client.list_all_resources())
            .await
            .map_err(|_| SessionError::Timeout(deadline))?
            .map_err(|e| SessionError::Protocol(e.to_string()))?;
        let v =
            serde_json::to_value(&listed).map_err(|e| SessionError::Malformed(e.to_string()))?;
        Ok(v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|r| {
                        let uri = r.get("uri")?.as_str()?.to_string();
                        let mime = r
                            .get("mimeType")
                            .and_then(Value::as_str)
                            .map(str::to_string);
                        Some((uri, mime))
                    })
                    .collect()
            })
            .unwrap_or_default())
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
    /// call that times out is cancelled at the server (`notifications/cancelled`).
    pub async fn call(
        &self,
        tool: &str,
        arguments: Map<String, Value>,
        deadline: Duration,
    ) -> Result<Outcome, SessionError> {
        let params = CallToolRequestParams::new(tool.to_string()).with_arguments(arguments);
        let answer = tokio::time::timeout(deadline, self.client.call_tool_once(params))
            .await
            .map_err(|_| SessionError::Timeout(deadline))?
            .map_err(|e| SessionError::Protocol(e.to_string()))?;
        match answer {
            CallToolResponse::Complete(result) => {
                let v = serde_json::to_value(&result)
                    .map_err(|e| SessionError::Malformed(e.to_string()))?;
                let size = serde_json::to_vec(&v).map_or(usize::MAX, |b| b.len());
                if size > MAX_RESULT_BYTES {
                    return Err(SessionError::Malformed(format!(
                        "the result is {size} bytes; the most taken is {MAX_RESULT_BYTES}"
                    )));
                }
                Ok(Outcome::from_result(&v))
            }
            CallToolResponse::InputRequired(_) => {
                Err(SessionError::InputRequired("input_required"))
            }
            CallToolResponse::Task(_) => Err(SessionError::InputRequired("a task to poll")),
            _ => Err(SessionError::Malformed(
                "a kind of tool result this client does not know".into(),
            )),
        }
    }

    /// Ends the session (the server sees its stdin close).
    pub async fn close(self) {
        let _ = self.client.cancel().await;
    }
}
