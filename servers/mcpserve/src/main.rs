//! `warren-mcp-server`: runs inside a warren namespace (`warren mcp serve` starts it there) and
//! serves the tools it finds under its own `/tool` and `/mnt/mcp/*` to one MCP client on
//! stdin/stdout. It holds no authority the namespace does not: every call is a write and a read
//! of a call file, so the gate decides it and receiptd records it exactly as for any program
//! in the namespace. `docs/mcp.md` ("Serving a namespace to an MCP client").

mod call;
mod grant;
mod http;
mod lines;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, MetaObject, PaginatedRequestParams, ProgressNotificationParam,
    ProtocolVersion, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};

use crate::grant::{Grant, Roots};

#[derive(Parser)]
#[command(name = "warren-mcp-server", version, about)]
struct Args {
    /// The built-in tools' tree.
    #[arg(long, default_value = "/tool")]
    tool_root: PathBuf,
    /// The directory holding one tree per mounted MCP server.
    #[arg(long, default_value = "/mnt/mcp")]
    mcp_root: PathBuf,
    /// Serve the one mounted MCP server's tools under their own names (nothing is served
    /// unless it is the whole grant).
    #[arg(long)]
    plain_names: bool,
    /// Serve streamable HTTP on the listening socket that is stdin (made by `warren mcp serve`)
    /// instead of MCP on stdin/stdout.
    #[arg(long)]
    http: bool,
    /// A name besides the loopback ones that a request's Host and Origin may carry (the
    /// operator's `--allow-remote`).
    #[arg(long = "allow-host")]
    allow_hosts: Vec<String>,
}

/// How often a waiting call tells a client that asked for progress that it still waits.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

#[derive(Clone)]
pub(crate) struct Namespace {
    roots: Roots,
    /// The last listing read; a name not in it is looked up again before it is refused.
    grant: Arc<Mutex<Grant>>,
}

impl Namespace {
    fn rescan(&self) -> Grant {
        let grant = self.roots.scan();
        *self.grant.lock().unwrap_or_else(|e| e.into_inner()) = grant.clone();
        grant
    }

    fn lookup(&self, name: &str) -> Option<grant::Granted> {
        let cached = self
            .grant
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .tools
            .get(name)
            .cloned();
        cached.or_else(|| self.rescan().tools.get(name).cloned())
    }
}

fn does_not_exist(name: &str) -> ErrorData {
    ErrorData::invalid_params(
        format!("tool {name:?} does not exist: this namespace grants no such tool"),
        None,
    )
}

impl ServerHandler for Namespace {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new(
                "warren-mcp-server",
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(
                "The tools this warren namespace grants. Every call is decided by warren's \
                 gate (it may wait for the operator) and receipted; a denied call is a tool \
                 error saying why.",
            )
    }

    fn supported_protocol_versions(&self) -> std::borrow::Cow<'static, [ProtocolVersion]> {
        // The revisions with an `initialize` handshake and `ping`: what this server implements.
        std::borrow::Cow::Owned(vec![
            ProtocolVersion::V_2025_11_25,
            ProtocolVersion::V_2025_06_18,
            ProtocolVersion::V_2025_03_26,
            ProtocolVersion::V_2024_11_05,
        ])
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let this = self.clone();
        let tools = tokio::task::spawn_blocking(move || {
            let grant = this.rescan();
            let mut tools = Vec::new();
            for (name, granted) in &grant.tools {
                match granted.describe(name) {
                    Ok(tool) => tools.push(tool),
                    // Listed but not readable (e.g. gone since): not offered.
                    Err(e) => eprintln!("warren-mcp-server: {name}: {e}"),
                }
            }
            tools
        })
        .await
        .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.to_string();
        let cached = self
            .grant
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .tools
            .get(&name)
            .cloned();
        let granted = match cached {
            Some(granted) => granted,
            None => {
                let this = self.clone();
                let lookup_name = name.clone();
                tokio::task::spawn_blocking(move || this.lookup(&lookup_name))
                    .await
                    .map_err(|e| ErrorData::internal_error(e.to_string(), None))?
                    .ok_or_else(|| does_not_exist(&name))?
            }
        };
        let args = serde_json::to_vec(&request.arguments.unwrap_or_default())
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        let mut pending = call::start(granted.dir, args);
        let progress = context.meta.get_progress_token();
        let mut ticks = tokio::time::interval(PROGRESS_EVERY);
        let mut waited = 0u32;
        let outcome = loop {
            tokio::select! {
                outcome = &mut pending.result => break outcome,
                _ = context.ct.cancelled() => {
                    // Dropping `pending` withdraws the call.
                    return Err(ErrorData::internal_error("the call was cancelled by the client and withdrawn", None));
                }
                _ = ticks.tick(), if progress.is_some() => {
                    let token = progress.clone().expect("guarded");
                    let mut note = ProgressNotificationParam::new(token, f64::from(waited));
                    note.message = Some(if waited == 0 {
                        "the call is with warren's gate (an ask waits for the operator) or running".into()
                    } else {
                        format!("still waiting for the gate or the tool ({waited} s)")
                    });
                    let _ = context.peer.notify_progress(note).await;
                    waited += 1;
                }
            }
        };
        match outcome {
            Ok(Ok(bytes)) => Ok(result_of(&name, &bytes).into()),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => Err(does_not_exist(&name)),
            Ok(Err(e)) => Ok(CallToolResult::error(vec![ContentBlock::text(format!(
                "the call of {name} failed in the namespace: {e}"
            ))])
            .into()),
            Err(_) => Err(ErrorData::internal_error("the call's thread ended", None)),
        }
    }
}

/// The envelope (specs/tool-tree.md §6) as an MCP result: `content` as text, `isError` unless
/// `status` is `ok`; the whole envelope (digest, taint, receipt, basis) under `_meta`.
fn result_of(name: &str, bytes: &[u8]) -> CallToolResult {
    let envelope: serde_json::Value = match serde_json::from_slice(bytes) {
        Ok(v) => v,
        Err(e) => {
            return CallToolResult::error(vec![ContentBlock::text(format!(
                "the call of {name} returned no envelope: {e}"
            ))]);
        }
    };
    let content = envelope["content"].as_str().unwrap_or_default().to_string();
    let mut result = if envelope["status"] == "ok" {
        CallToolResult::success(vec![ContentBlock::text(content)])
    } else {
        CallToolResult::error(vec![ContentBlock::text(content)])
    };
    let mut meta = serde_json::Map::new();
    meta.insert("warren/envelope".into(), envelope);
    result.meta = Some(MetaObject(meta));
    result
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Installs a handler: the signal that interrupts a withdrawn call's read kills nothing.
    let _interrupts =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())?;
    let namespace = Namespace {
        roots: Roots {
            tool: args.tool_root,
            mcp: args.mcp_root,
            plain: args.plain_names,
        },
        grant: Arc::default(),
    };
    let served = if args.http {
        http::serve(namespace, &args.allow_hosts).await
    } else {
        match namespace.serve(lines::stdio()).await {
            Ok(service) => service.waiting().await.map(drop).map_err(Into::into),
            Err(e) => Err(e.into()),
        }
    };
    // A call still blocked in its read is ended with the process (its read interrupted, the
    // call withdrawn if it had not started); nothing waits for it, as dropping the runtime
    // would.
    if let Err(e) = served {
        eprintln!("warren-mcp-server: {e:#}");
        std::process::exit(1);
    }
    std::process::exit(0);
}
