//! One client session with one MCP server, over any byte stream (a stdio server's pipes, which
//! mcpfs gets from the namespace nsd runs the server in), through the official Rust SDK.
//!
//! The session declares no client capabilities: a server's requests for sampling, elicitation
//! or roots are refused with an error, and a result that asks for input (`input_required`) or
//! hands back a task is a clear error to the caller, not a hang. Every call has a deadline.

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

/// A live session. Dropping it closes the stream.
pub struct Session {
    client: RunningService<RoleClient, ()>,
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
        let client = tokio::time::timeout(deadline, ().serve((reader, writer)))
            .await
            .map_err(|_| SessionError::Timeout(deadline))?
            .map_err(|e| SessionError::Handshake(e.to_string()))?;
        Ok(Session { client })
    }

    /// Speaks MCP to a streamable-HTTP server at `url` (the handshake first), within
    /// `deadline`. Plain `http://` only: this build carries no TLS provider for the MCP client
    /// (`docs/gaps.md`).
    pub async fn http(url: &str, deadline: Duration) -> Result<Session, SessionError> {
        let transport = rmcp::transport::StreamableHttpClientTransport::from_uri(url.to_string());
        let client = tokio::time::timeout(deadline, ().serve(transport))
            .await
            .map_err(|_| SessionError::Timeout(deadline))?
            .map_err(|e| SessionError::Handshake(e.to_string()))?;
        Ok(Session { client })
    }

    /// The server's name and version as it gave them, for logs and `warren mcp check`.
    pub fn server_info(&self) -> Option<String> {
        self.client
            .peer_info()
            .and_then(|i| i.server_info.clone())
            .map(|s| format!("{} {}", s.name, s.version))
    }

    /// Every tool the server lists (all pages), each made a [`Definition`] or refused.
    pub async fn tools(
        &self,
        deadline: Duration,
    ) -> Result<Vec<Result<Definition, Unservable>>, SessionError> {
        let tools = tokio::time::timeout(deadline, self.client.list_all_tools())
            .await
            .map_err(|_| SessionError::Timeout(deadline))?
            .map_err(|e| SessionError::Protocol(e.to_string()))?;
        tools
            .iter()
            .map(|t| {
                let v =
                    serde_json::to_value(t).map_err(|e| SessionError::Malformed(e.to_string()))?;
                Ok(Definition::from_listing(&v))
            })
            .collect()
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
