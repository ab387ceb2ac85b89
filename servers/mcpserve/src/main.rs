//! `warren-mcp-server`: runs inside a warren namespace (`warren mcp serve` starts it there) and
//! serves the tools it finds under its own `/tool` and `/mnt/mcp/*` to one MCP client on
//! stdin/stdout. It holds no authority the namespace does not: every call is a write and a read
//! of a call file, so the gate decides it and receiptd records it exactly as for any program
//! in the namespace. `docs/mcp.md` ("Serving a namespace to an MCP client").

mod call;
mod elicit;
mod grant;
mod http;
mod lines;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
// MCP's logging (`logging/setLevel`, `notifications/message`): rmcp marks it deprecated
// (SEP-2577), and clients still ask for it.
#[allow(deprecated)]
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListResourcesResult, ListToolsResult, LoggingLevel, LoggingMessageNotificationParam,
    MetaObject, PaginatedRequestParams, ProgressNotificationParam, ProgressToken, ProtocolVersion,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, Resource,
    ServerCapabilities, ServerConfig, SetLevelRequestParams,
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
    /// The gate tree of this namespace's own asks on a capped channel (mounted by nsd for
    /// `warren mcp serve --elicit`): a waiting call's ask is offered to a client that declared
    /// elicitation.
    #[arg(long = "client-asks", value_name = "PATH")]
    client_asks: Option<PathBuf>,
}

/// How often a waiting call tells a client that asked for progress that it still waits.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

#[derive(Clone)]
pub(crate) struct Namespace {
    roots: Roots,
    /// The last listing read; a name not in it is looked up again before it is refused.
    grant: Arc<Mutex<Grant>>,
    /// The least severe log level the client asked for (`logging/setLevel`), as its rank
    /// ([`level_rank`]): a mounted server's log messages below it are not relayed. One per
    /// client session.
    log_level: Arc<AtomicU8>,
    /// The channel a waiting call's ask is offered to the client on (`--client-asks`).
    client_asks: Option<elicit::ClientAsks>,
}

impl Namespace {
    /// The handler of one more client session: the same grant, a log level of its own.
    pub(crate) fn for_session(&self) -> Namespace {
        Namespace {
            log_level: Arc::default(),
            ..self.clone()
        }
    }

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

#[allow(deprecated)] // logging: see the `use` above
impl ServerHandler for Namespace {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .enable_logging()
                .build(),
        )
        .with_server_info(Implementation::new(
            "warren-mcp-server",
            env!("CARGO_PKG_VERSION"),
        ))
        .with_instructions(
            "The tools this warren namespace grants, and the resources of the MCP servers it \
             mounts whole. Every call is decided by warren's gate (it may wait for the \
             operator) and receipted; a denied call is a tool error saying why.",
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

    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.log_level
            .store(level_rank(request.level), Ordering::Relaxed);
        Ok(())
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let roots = self.roots.clone();
        let resources = tokio::task::spawn_blocking(move || roots.resources())
            .await
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        Ok(ListResourcesResult::with_all_items(
            resources
                .into_keys()
                .map(|uri| Resource::new(uri.clone(), uri))
                .collect(),
        ))
    }

    /// A mounted server's resource, read through its `resources.mcp/` file (a `query` receipt
    /// names the read).
    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let roots = self.roots.clone();
        let uri = request.uri.clone();
        let read = tokio::task::spawn_blocking(move || {
            let file = roots.resources().remove(&uri)?;
            Some(std::fs::read(file))
        })
        .await
        .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        let bytes = match read {
            None => {
                return Err(ErrorData::resource_not_found(
                    format!(
                        "resource {:?} does not exist: no server this namespace mounts whole serves it",
                        request.uri
                    ),
                    None,
                ));
            }
            Some(Err(e)) => {
                return Err(ErrorData::internal_error(
                    format!("reading {} in the namespace failed: {e}", request.uri),
                    None,
                ));
            }
            Some(Ok(bytes)) => bytes,
        };
        let read: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        let contents = serde_json::from_value(read["contents"].clone())
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        Ok(ReadResourceResult::new(contents).into())
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
        // The ask of this call, offered to the client's user while it waits (a client that
        // declared elicitation, a namespace launched with `--elicit`).
        let offer = self
            .client_asks
            .clone()
            .filter(|_| elicit::client_elicits(&context.peer))
            .map(|asks| {
                asks.offer(
                    context.peer.clone(),
                    name.clone(),
                    granted.gate_name(),
                    args.clone(),
                )
            });
        let mut offering = offer.is_some();
        let mut offer = std::pin::pin!(async move {
            if let Some(offer) = offer {
                offer.await;
            }
        });
        let mut pending = call::start(granted.call_file(), args);
        let progress = context.meta.get_progress_token();
        let mut ticks = tokio::time::interval(PROGRESS_EVERY);
        let mut waited = 0u32;
        // The last progress sent: relayed progress never goes below it (MCP's progress only
        // increases).
        let mut sent = f64::NEG_INFINITY;
        let outcome = loop {
            tokio::select! {
                outcome = &mut pending.result => break outcome,
                // Offered (or not the channel's): the call waits on for the gate's decision.
                () = &mut offer, if offering => offering = false,
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
                    sent = f64::from(waited);
                    waited += 1;
                }
            }
        };
        match outcome {
            Ok(Ok(bytes)) => {
                let envelope = serde_json::from_slice::<serde_json::Value>(&bytes);
                if let Ok(envelope) = &envelope {
                    self.relay(envelope, progress.as_ref(), sent, &context)
                        .await;
                }
                Ok(result_of(&name, envelope).into())
            }
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => Err(does_not_exist(&name)),
            Ok(Err(e)) => Ok(CallToolResult::error(vec![ContentBlock::text(format!(
                "the call of {name} failed in the namespace: {e}"
            ))])
            .into()),
            Err(_) => Err(ErrorData::internal_error("the call's thread ended", None)),
        }
    }
}

impl Namespace {
    /// What a mounted MCP server said during the call (`call.mcp`'s `mcp.notifications`),
    /// handed on to the client before the result: its progress, under the client's progress
    /// token if it gave one (never below what was sent already), and its log messages at or
    /// above the client's level. They come when the call has ended, not as they were said.
    #[allow(deprecated)] // logging: see the `use` above
    async fn relay(
        &self,
        envelope: &serde_json::Value,
        progress: Option<&ProgressToken>,
        mut sent: f64,
        context: &RequestContext<RoleServer>,
    ) {
        let notes = envelope["mcp"]["notifications"].as_array();
        for note in notes.into_iter().flatten() {
            if let (Some(token), Some(p)) = (progress, note.get("progress")) {
                let Some(value) = p["progress"].as_f64() else {
                    continue;
                };
                sent = value.max(sent);
                let mut param = ProgressNotificationParam::new(token.clone(), sent);
                param.total = p["total"].as_f64();
                param.message = p["message"].as_str().map(str::to_string);
                let _ = context.peer.notify_progress(param).await;
            } else if let Some(log) = note.get("log") {
                let Ok(level) = serde_json::from_value::<LoggingLevel>(log["level"].clone()) else {
                    continue;
                };
                if level_rank(level) < self.log_level.load(Ordering::Relaxed) {
                    continue;
                }
                let mut param = LoggingMessageNotificationParam::new(level, log["data"].clone());
                param.logger = log["logger"].as_str().map(str::to_string);
                let _ = context.peer.notify_logging_message(param).await;
            }
        }
    }
}

/// A log level's rank, least severe (debug) first.
#[allow(deprecated)]
fn level_rank(level: LoggingLevel) -> u8 {
    match level {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}

/// The envelope (specs/tool-tree.md §6) as an MCP result: `isError` unless `status` is `ok`;
/// the whole envelope (digest, taint, receipt, basis) under `_meta`. The content is the
/// server's own content blocks when `call.mcp` gave them (`mcp.content`: each blob in them is
/// named by its digest in the envelope's text, which the receipt names), else the text.
fn result_of(name: &str, envelope: serde_json::Result<serde_json::Value>) -> CallToolResult {
    let mut envelope = match envelope {
        Ok(v) => v,
        Err(e) => {
            return CallToolResult::error(vec![ContentBlock::text(format!(
                "the call of {name} returned no envelope: {e}"
            ))]);
        }
    };
    let blocks = envelope
        .as_object_mut()
        .and_then(|e| e.remove("mcp"))
        .and_then(|mcp| serde_json::from_value::<Vec<ContentBlock>>(mcp["content"].clone()).ok())
        .filter(|blocks| !blocks.is_empty());
    let content = blocks.unwrap_or_else(|| {
        vec![ContentBlock::text(
            envelope["content"].as_str().unwrap_or_default(),
        )]
    });
    let mut result = if envelope["status"] == "ok" {
        CallToolResult::success(content)
    } else {
        CallToolResult::error(content)
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
        log_level: Arc::default(),
        client_asks: args.client_asks.map(elicit::ClientAsks::new),
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
